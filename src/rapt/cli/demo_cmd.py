"""`rapt demo`: a thin layer over rapt.demo_choice (the user's choice: uniform and by-kind noise,
the local model, fused) and, with --paper, rapt.demo (RAPT's ablation on paired seeds); it reads
the options, shows progress, prints the table and writes the results."""

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
    PERSONAL_ETA,
    PERSONAL_P,
    PERSONAL_RANK,
    PRECISION,
    PROTECT,
    PROTECT_WHAT,
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
    paper: bool
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
    personal_p: float | None
    personal_eta: float | None
    personal_rank: int | None
    seeds: int | None
    seed: int | None
    noise_seed: int | None
    channel: Path | None
    precision: str | None


_DEMO_HELP = {
    "paper": "RAPT's ablation instead (prefix tuning: no privacy / head only / +privatization / "
    "+reconstruction, the local model and fused; 600 rows, 3 seeds; several minutes more); the "
    "options marked (--paper) apply to it only",
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
    paper: bool = typer.Option(False, "--paper", help=_DEMO_HELP["paper"]),
    benchmark_config: bool = typer.Option(False, "--benchmark-config",
                                          help="(--paper) " + _DEMO_HELP["benchmark_config"]),
    backbone: str | None = typer.Option(None, help="default minilm"),
    dataset: str | None = typer.Option(None, help="default sst2-sentences"),
    train_size: int | None = typer.Option(None, help="default 400 (--paper: 600)"),
    test_size: int | None = typer.Option(None, help="default 300 (--paper: 500)"),
    method: str | None = typer.Option(None, help="(--paper) default prefix; the default demo "
                                      "tunes LoRA"),
    epochs: int | None = typer.Option(None, help="default 2"),
    lr: float | None = typer.Option(None, help=LR_HELP),
    batch_size: int | None = typer.Option(None, help="default 8"),
    max_length: int | None = typer.Option(None, help=_DEMO_HELP["max_length"]),
    plain_len: int | None = typer.Option(None, help="(--paper) plain tokens m (default 40)"),
    plain_sequences: int | None = typer.Option(None, help="(--paper) "
                                                + _DEMO_HELP["plain_sequences"]),
    num_virtual_tokens: int | None = typer.Option(None, help="(--paper) default 10"),
    head: str | None = typer.Option(None, help="(--paper) " + _DEMO_HELP["head"]),
    label_descriptions: str | None = typer.Option(None, help="(--paper) "
                                                   + _DEMO_HELP["label_descriptions"]),
    rec_reduction: str | None = typer.Option(None, help="(--paper) sum (eq. 7, default) | mean"),
    target_p: float | None = with_help(TARGET_P, TARGET_P_HELP + f" (the uniform arm, and "
                                       f"--paper; default {DEFAULT_TARGET_P:g})"),
    eta: float | None = with_help(ETA, "(--paper) η (overrides --target-p)"),
    min_p: float = MIN_P,
    protect: str | None = with_help(PROTECT, "(--paper) " + PROTECT_WHAT + " (default: all, "
                                    "the paper's uniform mechanism)"),
    frequent_rank: int = FREQUENT_RANK,
    other_p: float | None = OTHER_P, other_eta: float | None = OTHER_ETA,
    personal_p: float | None = PERSONAL_P, personal_eta: float | None = PERSONAL_ETA,
    personal_rank: int | None = PERSONAL_RANK,
    seeds: int | None = typer.Option(None, help="paired seeds (default 3)"),
    seed: int | None = typer.Option(None, help=_DEMO_HELP["seed"]),
    noise_seed: int | None = typer.Option(None, help=_DEMO_HELP["noise_seed"]),
    channel: Path | None = typer.Option(None, "--channel", help="(--paper) "
                                        + _DEMO_HELP["channel"]),
    precision: str | None = with_help(PRECISION, PRECISION_HELP + " (default fp32; --paper: "
                                      "auto, measured equal to fp32 in that setting)"),
) -> None:
    """The choice you make with rapt, on SST-2 and paired seeds: noise by kind of token (rapt's
    default, --protect rare: rare words at P 0.7's η, personal data and words outside the
    10,000 most frequent at η 0, frequent words in clear) against uniform noise (--protect all,
    P 0.6), each tuned with LoRA and fused with a local TF-IDF model trained on your clean rows,
    beside that local model alone; one table of accuracy and privacy per kind of token (all,
    rare words, personal data), the verdict `rapt tune` prints, and a plot.
    --paper: RAPT's ablation (no privacy / head only / +privatization / +reconstruction, and
    +denoise-then-tune with --channel) with the local and fused rows."""
    opts = DemoOptions(**locals())  # the options, before any other name
    if not paper:
        return _choice(opts)
    cfg = _demo_config(opts)
    from rapt.demo import format_table, make_plot, run_demo

    res = _run_with_bars(run_demo, cfg, noise_seed)
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


# Options of RAPT's ablation only; the default demo refuses them rather than ignore them.
PAPER_ONLY = ("benchmark_config", "method", "plain_len", "plain_sequences", "num_virtual_tokens",
              "head", "label_descriptions", "rec_reduction", "eta", "other_p", "other_eta",
              "personal_p", "personal_eta", "personal_rank", "channel")
CHOICE_FIELDS = ("backbone", "dataset", "train_size", "test_size", "epochs", "lr", "batch_size",
                 "max_length", "target_p", "frequent_rank", "seeds", "seed", "noise_seed",
                 "precision")


def _choice(o: DemoOptions) -> None:
    """The default demo (rapt.demo_choice): run, print, write results.{json,md} and demo.png."""
    from rapt.demo_choice import ChoiceConfig, format_table, make_plot, run_choice, verdict_lines

    paper_only = [k for k in PAPER_ONLY if getattr(o, k) not in (None, False)]
    paper_only += ["protect"] if o.protect not in (None, "all") else []
    if paper_only:
        fail(", ".join("--" + k.replace("_", "-") for k in paper_only) + ": options of RAPT's "
             "ablation; add --paper (the default demo runs uniform noise and --protect rare "
             "side by side)")
    try:
        cfg = ChoiceConfig(**{k: getattr(o, k) for k in CHOICE_FIELDS
                              if getattr(o, k) is not None})
    except ValueError as e:
        fail(str(e))
    res = _run_with_bars(run_choice, cfg, o.noise_seed)
    o.out.mkdir(parents=True, exist_ok=True)
    make_plot(res).savefig(o.out / "demo.png", dpi=120)
    table = format_table(res)
    (o.out / "results.json").write_text(json.dumps(res.as_dict(), indent=2, default=float)
                                        + "\n")
    (o.out / "results.md").write_text(table + "\n\n" + "\n\n".join(verdict_lines(res)) + "\n")
    _keep_local_unless_public(cfg.dataset, o.out)
    typer.echo("\n" + table + "\n")
    for line in verdict_lines(res):
        typer.echo(line)
    for arm, rec in res.arms.items():
        warn_weak_privacy(rec["report"], backbone=cfg.backbone, min_p=o.min_p,
                          what=f"demo's {arm} release")
    typer.echo(f"\nwrote {o.out / 'results.json'}, {o.out / 'results.md'}, {o.out / 'demo.png'}")


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
             if v is not None and k not in ("out", "paper", "benchmark_config", "min_p")}
    if o.label_descriptions:
        given["label_descriptions"] = [d.strip() for d in o.label_descriptions.split("|")]
    if o.channel is not None:
        given["channel"] = str(o.channel)  # a string in results.json
    check_kind_options(KindOptions.of(o))
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


def _run_with_bars(run: Any, cfg: Any, noise_seed: int | None) -> Any:
    """``run(cfg, log=, progress=)`` with one step bar per setting on stderr; a ValueError is
    one error line."""
    warn_if_seeded(noise_seed)
    bars = _SettingBars()
    try:
        return run(cfg, log=lambda s: typer.echo(s), progress=bars)
    except ValueError as e:
        fail(str(e))
    finally:
        bars.close()


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
