"""A job's loss curves as inline SVG, drawn on the server (no script, no CDN): one panel per
series, each with its own y axis, over the same steps, from the training history the worker
saved with the prompt (``{"step", "loss", "task_loss", "rec_loss", ...}`` per optimizer step)."""

from __future__ import annotations

import math
from html import escape

WIDTH, PANEL_H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 150, 64, 16, 22, 26

# (history field, panel title, colour); the first field present in a record is used for
# the task panel, so a history without task_loss (older prompts) shows the total loss.
SERIES = ((("task_loss", "loss"), "task loss", "#1f5fa8"),
          (("rec_loss",), "L_rec (reconstruction)", "#b4441c"))


def curve_series(history: list[dict]) -> list[tuple[str, str, list[tuple[float, float]]]]:
    """(title, colour, [(step, value)]) per series the history holds finite values of."""
    out = []
    for fields, title, colour in SERIES:
        pts = []
        for i, rec in enumerate(history):
            v = next((rec[f] for f in fields if rec.get(f) is not None), None)
            if isinstance(v, (int, float)) and math.isfinite(v):
                pts.append((float(rec.get("step", i + 1)), float(v)))
        if pts:
            out.append((title, colour, pts))
    return out


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _panel(title: str, colour: str, pts: list[tuple[float, float]], top: int,
           x0: float, x1: float) -> str:
    """One panel: frame, min/max labels on both axes, the polyline."""
    ys = [v for _, v in pts]
    y0, y1 = min(ys), max(ys)
    if y1 - y0 < 1e-12:  # a flat series: a line in the middle, not a division by zero
        y0, y1 = y0 - 0.5, y1 + 0.5
    w, h = WIDTH - PAD_L - PAD_R, PANEL_H - PAD_T - PAD_B
    span_x = (x1 - x0) or 1.0

    def xy(s: float, v: float) -> str:
        return f"{PAD_L + (s - x0) / span_x * w:.1f},{top + PAD_T + (y1 - v) / (y1 - y0) * h:.1f}"

    line = " ".join(xy(s, v) for s, v in pts)
    bottom = top + PAD_T + h
    return (
        f'<text x="{PAD_L}" y="{top + 15}" class="title">{escape(title)}</text>'
        f'<rect x="{PAD_L}" y="{top + PAD_T}" width="{w}" height="{h}" class="frame"/>'
        f'<text x="{PAD_L - 6}" y="{top + PAD_T + 4}" text-anchor="end">{_fmt(y1)}</text>'
        f'<text x="{PAD_L - 6}" y="{bottom}" text-anchor="end">{_fmt(y0)}</text>'
        f'<text x="{PAD_L}" y="{bottom + 16}">step {_fmt(x0)}</text>'
        f'<text x="{PAD_L + w}" y="{bottom + 16}" text-anchor="end">{_fmt(x1)}</text>'
        f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>')


def loss_svg(history: list[dict]) -> str | None:
    """The SVG document for ``history``; None when it holds no loss to draw."""
    series = curve_series(history)
    if not series:
        return None
    steps = [s for _, _, pts in series for s, _ in pts]
    x0, x1 = min(steps), max(steps)
    panels = "".join(_panel(t, c, pts, i * PANEL_H, x0, x1)
                     for i, (t, c, pts) in enumerate(series))
    height = PANEL_H * len(series)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="curve" width="{WIDTH}" '
            f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
            f'aria-label="loss curves">{panels}</svg>')
