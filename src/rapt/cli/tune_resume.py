"""`rapt tune` stopped and resumed: Ctrl-C or SIGTERM stops the run after its current step and
saves a checkpoint beside the output folder; `rapt tune ... --resume` continues it exactly
(data order, init and dropout; DP-SGD draws fresh noise, as every resumed DP run).

The checkpoint (``OUT.resume.NOT-PRIVATE.pt`` next to OUT, never inside it: the folder is the
part one shares; mode 0600) holds the trainer's state
(:meth:`rapt.training.loop.TrainState.state_dict`), the tuner config, and the *privatized* training
rows with their labels and privacy report: a resumed run trains on the same release instead of
privatizing the data a second time (two independent privatizations of one text would give an
attacker two noisy looks at it), and the seconds trained so far (the finished run's
``train_seconds`` and its progress bar count the whole run). It is deleted when the run
finishes.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from rapt.cli._app import fail

FILE = "resume.NOT-PRIVATE.pt"
FORMAT = "rapt-tune-resume"
VERSION = 1


def path_in(out: Path) -> Path:
    """Where the checkpoint of a run into ``out`` goes: ``OUT.resume.NOT-PRIVATE.pt``."""
    from rapt.artifacts import beside

    return beside(out, FILE)


def _legacy(out: Path) -> Path:
    """Inside the folder, where rapt wrote it before (read by --resume, removed by drop)."""
    return Path(out) / FILE


@dataclass
class Resume:
    """What a stopped run left: trainer state, privatized rows, labels, privacy report."""

    state: dict
    rows: list[list[int]]
    labels: list[int]
    privacy: dict | None
    eta: float | None
    seconds: float = 0.0  # training time before the stop

    @property
    def step(self) -> int:
        return int(self.state.get("step", 0))


def _mismatch(saved: dict, now: dict) -> list[str]:
    keys = sorted(set(saved) | set(now))
    return [f"{k}: {saved.get(k)!r} in the checkpoint, {now.get(k)!r} now" for k in keys
            if k != "checkpoint_every" and saved.get(k) != now.get(k)]


def load(out: Path, config: Any, labels: list[int], eta: float | None) -> Resume:
    """The checkpoint in ``out``, checked against this run: the same tuner config, training
    labels (so the same data) and η; one error line naming what differs otherwise."""
    import torch

    path = path_in(out)
    if not path.is_file() and _legacy(out).is_file():
        path = _legacy(out)
    if not path.is_file():
        fail(f"--resume: no checkpoint for {out} ({path.name} is written beside it when a run "
             "is stopped with Ctrl-C or SIGTERM); leave --resume out to start afresh")
    try:
        doc = torch.load(path, weights_only=True)
    except Exception as e:  # a truncated or foreign file: say which
        fail(f"{path}: cannot read the checkpoint ({type(e).__name__}: {e})")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        fail(f"{path}: not a `rapt tune` checkpoint (field 'format' must be {FORMAT!r}, version "
             f"{VERSION})")
    diff = _mismatch(doc["config"], config.to_dict())
    if diff:
        fail(f"--resume: the options differ from the stopped run's ({'; '.join(diff)}); give "
             "the same ones, or leave --resume out to start afresh")
    if list(doc["labels"]) != list(labels):
        fail(f"--resume: the training data differ from the stopped run's ({len(doc['labels'])} "
             f"labelled rows then, {len(labels)} now, or other labels); give the same data "
             "and the same --local / --no-local (--local holds rows out of training)")
    if (doc.get("eta") is None) != (eta is None) or (
            eta is not None and abs(float(doc["eta"]) - float(eta)) > 1e-9 * float(eta)):
        fail(f"--resume: η {eta} now, {doc.get('eta')} in the stopped run; give the same "
             "--eta / --target-p / --target-ep")
    return Resume(doc["state"], [list(r) for r in doc["rows"]], list(doc["labels"]),
                  doc.get("privacy"), doc.get("eta"), float(doc.get("seconds") or 0.0))


def save(out: Path, state: dict, config: Any, rows: list[list[int]], labels: list[int],
         privacy: dict | None, eta: float | None, seconds: float = 0.0) -> Path:
    """Write the checkpoint atomically, readable by its owner only (0600); ``seconds``: the
    training time so far, this run's and any earlier part's."""
    import io

    import torch

    from rapt.artifacts import write_private

    doc = {"format": FORMAT, "version": VERSION, "state": state, "config": config.to_dict(),
           "rows": [list(map(int, r)) for r in rows], "labels": [int(y) for y in labels],
           "privacy": privacy, "eta": eta, "seconds": float(seconds)}
    buf = io.BytesIO()
    torch.save(doc, buf)
    return write_private(path_in(out), buf.getvalue())


def drop(out: Path) -> None:
    """Delete a finished run's checkpoint (it holds the release and the trained state)."""
    path_in(out).unlink(missing_ok=True)
    _legacy(out).unlink(missing_ok=True)


@dataclass
class StopSignals:
    """While active: the first Ctrl-C (SIGINT) or SIGTERM asks the run to stop after its
    current step (``should_stop``); a second Ctrl-C aborts at once, without a checkpoint.
    ``latest`` keeps the newest state the trainer handed to ``checkpoint``."""

    signum: int | None = None
    latest: dict | None = None
    _previous: dict = field(default_factory=dict)

    def should_stop(self) -> bool:
        return self.signum is not None

    def checkpoint(self, state: dict) -> None:
        self.latest = state

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        typer.echo(f"\n{signal.Signals(signum).name}: stopping after this step and saving a "
                   "checkpoint (Ctrl-C again to abort without one)", err=True)

    def __enter__(self) -> StopSignals:
        for s in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread (a test runner's worker): no handlers
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)

    @property
    def exit_code(self) -> int:
        """The shell's code for a run ended by this signal (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + int(self.signum or 0)
