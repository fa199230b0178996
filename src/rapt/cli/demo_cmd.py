"""`rapt demo`: a thin layer over rapt.demo (the RAPT benchmark's regime on paired seeds); it
reads the options, shows progress, prints the table and writes the results."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from rapt.cli._app import TARGET_P_HELP, app, fail, warn_if_seeded, warn_weak_privacy
from rapt.cli._by_kind import KindOptions, check_kind_options
from rapt.cli._tuning import loss_postfix
from rapt.cli.options import (
    ETA,
    FREQUENT_RANK,
    MIN_P,
    OTHER_ETA,
    OTHER_P,
    PRECISION,
    PROTECT,
    TARGET_P,
    with_help,
)
from rapt.config import LR_HELP, PRECISION_HELP
from rapt.privacy.rule import DEFAULT_TARGET_P


@dataclass(frozen=True)
class DemoOptions:
    """The options of `rapt demo`, one field per parameter; None: not given (the demo's default,
    or the benchmark's with --benchmark-config)."""

    out: Path
    benchmark_config: bool
    backbone: str | None
    dataset: str | None
    train_size: int | None
    test_size: int | None
    method: str | None
    epochs: int | None
    lr: float | None
    batch_size: int | None
    max_length: int | None
    plain_len: int | None
    plain_sequences: int | None
    num_virtual_tokens: int | None
    head: str | None
    label_descriptions: str | None
    rec_reduction: str | None
    target_p: float | None
    eta: float | None
    min_p: float
    protect: str
    frequent_rank: int
    other_p: float | None
    other_eta: float | None
    seeds: int | None
    seed: int | None
    noise_seed: int | None
    channel: Path | None
    precision: str | None


_DEMO_HELP = {
    "benchmark_config": "run benchmarks/bench_rapt.py's cpu configuration at P 0.4 (1,000 rows, "
    "500 steps, 5 seeds; about 40 min on 2 cores); other options override it",
    "max_length": "text tokens per row, plain tokens excluded (default: the length that keeps "
    "95 % of training rows whole)",
    "plain_sequences": "random plain sequences, one drawn per row (default 1)",
    "head": "auto (default: label-description on encoders, verbalizer on causal LMs; frozen, the "
    "prompt carries the task) | label-description | verbalizer | linear (a trainable probe, a "
    "control)",
    "label_descriptions": "'|'-separated, one per label (default: the built-in dataset's)",
    "seed": "data subset and first seed's init and plain tokens, not privacy noise (default 0)",
    "noise_seed": "seed the privatization noise (repeatable table, no guarantee); default: OS "
    "entropy",
    "channel": "a channel model folder from `rapt adapt` (same backbone): adds a "
    "+channel adapter row (the +privatization rows and queries read by the adapted backbone) or "
    "a +denoise-then-tune row (read back by a denoiser), and a line on how much of the "
    "privatization gap it wins back; it adds that row's runs to the time",
}


@app.command()
def demo(
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="output folder"),
    benchmark_config: bool = typer.Option(False, "--benchmark-config",
                                          help=_DEMO_HELP["benchmark_config"]),
    backbone: str | None = typer.Option(None, help="default minilm"),
    dataset: str | None = typer.Option(None, help="default sst2-sentences"),
    train_size: int | None = typer.Option(None, help="default 600"),
    test_size: int | None = typer.Option(None, help="default 500"),
    method: str | None = typer.Option(None, help="default prefix"),
    epochs: int | None = typer.Option(None, help="default 2"),
    lr: float | None = typer.Option(None, help=LR_HELP),
    batch_size: int | None = typer.Option(None, help="default 8"),
    max_length: int | None = typer.Option(None, help=_DEMO_HELP["max_length"]),
    plain_len: int | None = typer.Option(None, help="plain tokens m (default 40)"),
    plain_sequences: int | None = typer.Option(None, help=_DEMO_HELP["plain_sequences"]),
    num_virtual_tokens: int | None = typer.Option(None, help="default 10"),
    head: str | None = typer.Option(None, help=_DEMO_HELP["head"]),
    label_descriptions: str | None = typer.Option(None, help=_DEMO_HELP["label_descriptions"]),
    rec_reduction: str | None = typer.Option(None, help="sum (eq. 7, default) | mean"),
    target_p: float | None = with_help(TARGET_P, TARGET_P_HELP + f" (default "
                                       f"{DEFAULT_TARGET_P:g})"),
    eta: float | None = with_help(ETA, "η (overrides --target-p)"),
    min_p: float = MIN_P,
    protect: str = PROTECT, frequent_rank: int = FREQUENT_RANK,
    other_p: float | None = OTHER_P, other_eta: float | None = OTHER_ETA,
    seeds: int | None = typer.Option(None, help="paired seeds (default 3)"),
    seed: int | None = typer.Option(None, help=_DEMO_HELP["seed"]),
    noise_seed: int | None = typer.Option(None, help=_DEMO_HELP["noise_seed"]),
    channel: Path | None = typer.Option(None, "--channel", help=_DEMO_HELP["channel"]),
    precision: str | None = with_help(PRECISION, PRECISION_HELP + " (default auto: "
                                      "measured equal to fp32 in this setting)"),
) -> None:
    """RAPT end to end on a small SST-2 subset: privatize, tune (no privacy / head only /
    +privatization / +reconstruction, and +denoise-then-tune with --channel) on paired seeds,
    privatized inference, inversion attack; prints a table with CIs and verdict lines, writes a
    plot. Two more rows show the user's side, which sends nothing more: a local TF-IDF +
    logistic regression on the clean training rows, and it fused with +privatization (weights
    fitted on half of the test rows, scored on the other half, both ways round)."""
    cfg = _demo_config(DemoOptions(**locals()))  # the options, before any other name
    from rapt.demo import format_table, make_plot, run_demo

    warn_if_seeded(noise_seed)
    bars = _SettingBars()
    try:
        res = run_demo(cfg, log=lambda s: typer.echo(s), progress=bars)
    except ValueError as e:
        fail(str(e))
    bars.close()
    t = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    fig = make_plot(res)
    fig.savefig(out / "demo.png", dpi=120)
    res.stage_seconds["plot"] = time.perf_counter() - t
    table = format_table(res)
    (out / "results.json").write_text(json.dumps(res.as_dict(), indent=2) + "\n")
    (out / "results.md").write_text(table + "\n")
    _keep_local_unless_public(cfg.dataset, out)
    typer.echo(f"plot: {res.stage_seconds['plot']:.1f} s")
    typer.echo("")
    typer.echo(table)
    warn_weak_privacy({"eta": res.eta, "replacement_probability": res.p,
                       "inversion_success": res.inversion_success}, backbone=cfg.backbone,
                      min_p=min_p, what="demo's privatized text")
    typer.echo(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {out / 'demo.png'}")


def _keep_local_unless_public(dataset: str, out: Path) -> None:
    """The demo's folder holds accuracies and privacy measured on its data: shareable for a
    built-in public set; on a file of your own they are statistics of your rows, so the files
    are made owner-only (0600) and the folder is named as not to be shared."""
    from rapt.data import BUILTINS

    if dataset in BUILTINS:
        return
    for name in ("results.json", "results.md", "demo.png"):
        if (out / name).exists():
            (out / name).chmod(0o600)
    typer.echo(f"note: {out} holds accuracies and privacy measured on {dataset}, your own "
               "rows (files made owner-only, 0600): keep it local, do not share it", err=True)


def _demo_config(o: DemoOptions):
    """The DemoConfig of `rapt demo`'s options (those given override the defaults, or the
    benchmark's with --benchmark-config); a bad value is one error line."""
    from rapt.demo import DemoConfig
    from rapt.tuning.tune import HEADS

    given = {k: v for k, v in dataclasses.asdict(o).items()
             if v is not None and k not in ("out", "benchmark_config", "min_p")}
    if o.label_descriptions:
        given["label_descriptions"] = [d.strip() for d in o.label_descriptions.split("|")]
    if o.channel is not None:
        given["channel"] = str(o.channel)  # a string in results.json
    check_kind_options(KindOptions(o.protect, o.frequent_rank, o.other_p, o.other_eta))
    if o.protect not in (None, "all") and o.target_p is None and o.eta is None \
            and not o.benchmark_config:
        from rapt.privacy.rule import DEFAULT_PROTECTED_P

        given["target_p"] = DEFAULT_PROTECTED_P  # the protected classes' default, as elsewhere
    if o.head is not None and o.head not in HEADS:
        fail(f"--head must be one of {', '.join(HEADS)} (got {o.head!r})")
    if o.rec_reduction is not None and o.rec_reduction not in ("sum", "mean"):
        fail(f"--rec-reduction must be sum or mean (got {o.rec_reduction!r})")
    try:
        return DemoConfig.benchmark(**given) if o.benchmark_config else DemoConfig(**given)
    except ValueError as e:
        fail(str(e))


class _SettingBars:
    """``progress(setting, step_record)`` for run_demo: one stderr step bar per setting, the
    previous ones closed when a new setting starts."""

    def __init__(self) -> None:
        self.bars: dict[str, Any] = {}

    def __call__(self, setting: str, r: dict) -> None:
        from rapt.progress import progress_bar

        if setting not in self.bars:
            self.close()
            self.bars[setting] = progress_bar(total=r["total_steps"], desc=setting,
                                              unit="step", leave=False)
        self.bars[setting].set_postfix(loss_postfix(r))
        self.bars[setting].update(1)

    def close(self) -> None:
        for b in self.bars.values():
            b.close()
