"""The main job behind ``rapt demo``: the choice a user of rapt makes, on SST-2, on paired seeds.

A user asks: which setting should I use for my data, what privacy does it give, and does it beat
what I can do alone? The demo answers with the settings `rapt tune` offers, on the same rows:

* **uniform** (``--protect all``): every token privatized at η for P ≈
  :data:`rapt.privacy.rule.DEFAULT_TARGET_P`;
* **by kind** (``--protect rare``, rapt's default): words outside the 1,000 most frequent
  public words at η for P ≈ :data:`rapt.privacy.rule.DEFAULT_PROTECTED_P`, personal data
  (Presidio) and words outside the 10,000 most frequent at η 0 (each token swapped for a random
  one before the noise: ``--personal-p 1 --personal-rank 10000``), frequent words in clear
  (:mod:`rapt.privacy.by_kind`);
* the **local model** (TF-IDF + logistic regression on the clean rows, :mod:`rapt.local`), and
  each privatized model **fused** with it (weights cross-fitted on the test rows), what
  `rapt predict` uses by default.

Each seed privatizes the training rows and the test queries afresh, tunes LoRA (the product's
default method) on the release and scores the privatized queries. Privacy per kind of token (all
tokens, rare words, personal data) is nearest-neighbour inversion's on the first seed's test
queries: that attacker's figure, an upper bound on privacy (stronger attackers in
``benchmarks/results/privacy_by_mechanism.md``). Sized to finish in under 3 minutes on 2 CPU
cores without native bf16 (``benchmarks/results/wallclock.json``, "demo"): 400 training rows,
2 epochs of LoRA at batch 8 (100 steps), 300 test rows, 3 seeds (1 epoch: 40 s less, and
the by-kind LoRA 3 points lower in one run). LoRA because `rapt tune` uses
it by default; none of RAPT's ablation arms (no privacy, head only, +reconstruction with 40
plain tokens), which ``benchmarks/results/rapt_paper_gpu.md`` settled and which doubled the
tuning time. Fewer rows and steps than the
grid of ``benchmarks/results/local_baseline_by_kind.md`` (2,000 rows, 3 seeds), whose
conclusions (fused by kind beats the local model on SST-2; by kind beats uniform) the table is
there to show: its paired CIs say whether a run bears them out. RAPT's own
ablation (prefix tuning, +privatization / +reconstruction) is :mod:`rapt.demo` (``rapt demo
--paper``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rapt import numfmt
from rapt.config import PRECISIONS, tune_config
from rapt.demo import StageTimes, _demo_data, _text_length
from rapt.privacy.by_kind import DEFAULT_FREQUENT_RANK, DEFAULT_PERSONAL_RANK
from rapt.privacy.rule import DEFAULT_PROTECTED_P, DEFAULT_TARGET_P
from rapt.stats import mean_ci, paired_difference

ARMS = ("uniform", "by kind")
LOCAL = "local TF-IDF (clean, on your machine)"
KINDS = ("all", "rare", "personal")


def remote_name(arm: str) -> str:
    return f"privatized LoRA, {arm}"


def fused_name(arm: str) -> str:
    return f"fused: {arm} × local"


@dataclass
class ChoiceConfig:
    """The default demo's settings (module docstring for the sizes)."""

    backbone: str = "minilm"
    dataset: str = "sst2-sentences"
    train_size: int = 400
    test_size: int = 300
    epochs: int = 2
    batch_size: int = 8
    lr: float | None = None  # None: rapt.config.DEFAULT_LR["lora"]
    target_p: float = DEFAULT_TARGET_P  # the uniform arm
    protected_p: float = DEFAULT_PROTECTED_P  # the by-kind arm's protected classes
    personal_p: float = 1.0  # the by-kind arm's personal data (1: η 0, as `rapt tune`'s default)
    frequent_rank: int = DEFAULT_FREQUENT_RANK
    personal_rank: int | None = DEFAULT_PERSONAL_RANK  # beyond it: personal data's level
    whole_fraction: float = 0.95
    max_length: int | None = None  # tokens per row; None: whole_fraction of rows whole
    seeds: int = 3
    seed: int = 0  # data subset (fixed) and the first seed's init and order
    noise_seed: int | None = None  # privacy noise: OS entropy unless set
    precision: str = "fp32"  # rapt tune's default (auto was measured equal for --paper only)
    plain_len = 0  # no plain tokens k (rapt.demo's row-length helper reads it); not a field

    def __post_init__(self) -> None:
        for name in ("train_size", "test_size", "epochs", "batch_size", "seeds"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ChoiceConfig.{name} must be >= 1 (got {getattr(self, name)})")
        for name in ("target_p", "protected_p"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"ChoiceConfig.{name} must lie strictly between 0 and 1 "
                                 f"(got {getattr(self, name)})")
        if not self.protected_p <= self.personal_p <= 1:
            raise ValueError(f"ChoiceConfig.personal_p must lie in [protected_p, 1] (got "
                             f"{self.personal_p})")
        if self.precision not in PRECISIONS:
            raise ValueError(f"ChoiceConfig.precision must be one of {', '.join(PRECISIONS)} "
                             f"(got {self.precision!r})")

    @property
    def arms(self) -> dict[str, tuple[float, str]]:
        """arm -> (P its η is calibrated for, what it protects)."""
        return {"uniform": (self.target_p, "all"), "by kind": (self.protected_p, "rare")}


@dataclass
class ChoiceResult:
    config: dict
    arms: dict = field(default_factory=dict)  # arm -> η, class η, measured P, privacy by kind
    rows: list[dict] = field(default_factory=list)  # setting, accuracy, ci95, accuracies
    paired: dict = field(default_factory=dict)  # "a − b" -> rapt.stats.paired_difference
    verdicts: dict = field(default_factory=dict)  # arm -> the verdict `rapt tune` prints
    text_length: int = 0
    seconds: float = 0.0
    stage_seconds: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _customizations(config: ChoiceConfig, bb, log: Callable[[str], None]) -> dict:
    """arm -> Customization (η calibrated on the public sample as every command does)."""
    from rapt.pipeline import Customization
    from rapt.privacy.by_kind import make_policy
    from rapt.privacy.mechanism import calibrate_eta_public

    out = {}
    for arm, (p, protect) in config.arms.items():
        c = Customization.create(bb, target_p=p, noise_seed=config.noise_seed)
        if protect != "all":
            c.kind_policy = make_policy(c.eta, protect, config.frequent_rank,
                                        personal_p=config.personal_p,
                                        personal_rank=config.personal_rank,
                                        calibrate=lambda q: calibrate_eta_public(bb, q))
        out[arm] = c
        what = ("every token" if protect == "all" else
                f"words outside the {config.frequent_rank:,} most frequent public words, "
                + ("personal data" + ("" if config.personal_rank is None else
                                      f" and words outside the {config.personal_rank:,} most "
                                      "frequent")
                   + (" swapped for a uniformly drawn token (η 0)" if config.personal_p >= 1
                      else f" at P ≈ {config.personal_p:g}")) + " (the rest in clear)")
        log(f"{arm}: η = {numfmt.eta(c.eta)} (P ≈ {p:g} on the public text sample) on {what}")
    return out


def run_choice(config: ChoiceConfig, log: Callable[[str], None] = print,
               progress: Callable[[str, dict], None] | None = None,
               backbone: Any = None) -> ChoiceResult:
    """Run the default demo; ``progress(name, step_record)`` after each training step."""
    import numpy as np

    from rapt.local import LocalBaseline
    from rapt.local.fusion import cross_fitted
    from rapt.models import load_backbone

    t0, stages = time.perf_counter(), StageTimes()
    with stages.time("backbone"):
        bb = backbone if backbone is not None else load_backbone(config.backbone)
    with stages.time("data"):
        train, test = _demo_data(config, log)
        if any(p is not None for p in train.text_pairs):
            raise ValueError(f"{config.dataset} holds sentence pairs: the default demo takes "
                             "single texts (rapt demo --paper and rapt tune take pairs)")
        n_text, _ = _text_length(config, bb.tokenizer, train.texts, log)
        base = tune_config(dict(method="lora", epochs=config.epochs, lr=config.lr,
                                batch_size=config.batch_size, precision=config.precision),
                           kind=bb.kind, label_names=list(train.label_names),
                           dataset=config.dataset)
    with stages.time("calibration"):
        customs = _customizations(config, bb, log)
    with stages.time("local model"):
        local = LocalBaseline.fit(train.texts, train.labels, len(train.label_names),
                                  seed=config.seed).predict_proba(test.texts)
    y = np.asarray(test.labels)
    acc: dict[str, list[float]] = {n: [] for a in ARMS for n in (remote_name(a), fused_name(a))}
    acc[LOCAL] = [float((local.argmax(-1) == y).mean())] * config.seeds
    result = ChoiceResult(config=asdict(config), text_length=n_text)
    last: dict = {}
    for i in range(config.seeds):
        seed = config.seed + i
        for arm in ARMS:
            remote = _run_arm(customs[arm], replace(base, seed=seed, max_length=n_text),
                              (train, test), arm, seed, result, stages, log, progress)
            fused = cross_fitted(remote, local, y, seed=seed)
            acc[remote_name(arm)].append(float((remote.argmax(-1) == y).mean()))
            acc[fused_name(arm)].append(float((fused.argmax(-1) == y).mean()))
            last[arm] = (remote, fused)
            log(f"seed {seed}: {arm:8s} privatized {numfmt.pct(acc[remote_name(arm)][-1])}, "
                f"fused {numfmt.pct(acc[fused_name(arm)][-1])} "
                f"(local {numfmt.pct(acc[LOCAL][0])})")
    _summarize(result, acc, last, local, y)
    result.seconds = time.perf_counter() - t0
    result.stage_seconds = dict(stages.seconds)
    log(stages.line())
    return result


def _run_arm(custom, cfg, data, arm: str, seed: int, result: ChoiceResult, stages: StageTimes,
             log: Callable[[str], None], progress) -> Any:
    """One arm on one seed: privatize the rows and queries afresh, tune, score -> (N, C)
    probabilities of the privatized queries. The first seed measures privacy per kind."""
    (train, test), first = data, arm not in result.arms
    with stages.time("privatization"):
        rows = custom.privatize(custom.rows(train.texts), measure=False, texts=train.texts)
        clean_q = custom.rows(test.texts, queries=True)
        queries = custom.privatize(clean_q, measure=False, texts=test.texts)
    if first:
        with stages.time("privacy per kind"):
            _, _, classes = custom.kind_noise(clean_q, test.texts)
            rep = custom.measure(clean_q, queries, classes=classes)
        result.arms[arm] = _arm_record(custom, rep)
        log(f"{arm}: measured P {numfmt.p(rep['replacement_probability'])} (test queries); "
            "nearest-neighbour inversion leaves privacy "
            + ", ".join(f"{k} {_fmt(result.arms[arm]['privacy'][k])}" for k in KINDS))
    cb = (lambda r, name=f"{arm}, seed {seed}": progress(name, r)) if progress else None
    run = replace(custom, config=cfg)
    with stages.time("tuning"):
        run.tune(rows, train.labels, len(train.label_names), progress=cb)
    with stages.time("prediction"):
        return run.predict_proba(queries).float().cpu().numpy()


def _arm_record(custom, rep: dict) -> dict:
    by = rep.get("by_kind") or {}
    return {"eta": float(custom.eta), "target_p": custom.target_p,
            "class_eta": (custom.kind_record() or {}).get("class_eta"),
            "personal_rank": (custom.kind_record() or {}).get("personal_rank"),
            "p_measured": float(rep["replacement_probability"]),
            "attacker": "nearest-neighbour inversion (first seed's test queries)",
            "privacy": {k: (by.get(k) or {}).get("empirical_privacy") for k in KINDS},
            "n_tokens": {k: int((by.get(k) or {}).get("n_tokens") or 0) for k in KINDS},
            "report": rep}  # the privacy rule's input (rapt.privacy.rule)


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _summarize(result: ChoiceResult, acc: dict, last: dict, local, y) -> None:
    """Rows with CIs, the paired differences the choice turns on, and per arm the verdict
    `rapt tune` prints (its rule on the last seed's test rows)."""
    from rapt.local.fusion import choose_mode
    from rapt.local.verdict import Comparison, verdict

    for name, xs in acc.items():
        mean, ci = mean_ci(xs)
        result.rows.append({"setting": name, "accuracy": mean, "ci95": ci, "accuracies": xs})
    for a, b in ((fused_name("by kind"), LOCAL), (fused_name("uniform"), LOCAL),
                 (fused_name("by kind"), fused_name("uniform")),
                 (remote_name("by kind"), remote_name("uniform"))):
        result.paired[f"{a} − {b}"] = paired_difference(acc[a], acc[b])
    for arm, (remote, fused) in last.items():
        m = choose_mode(remote, local, fused, y)
        result.verdicts[arm] = verdict(Comparison(
            local=m["accuracy"]["local"], remote=m["accuracy"]["remote"],
            fused=m["accuracy"]["fused"], n_rows=len(y), majority=m["accuracy"]["majority"],
            mode=m["mode"], lead=m["lead"], flat=m["flat"], one_class=m["one_class"]))


def _pm(row: dict) -> str:
    return f"{100 * row['accuracy']:.1f} ± {100 * row['ci95']:.1f}"


def _diff(d: dict) -> str:
    return f"{100 * d['mean_diff']:+.1f} ± {100 * d['ci95']:.1f}"


def format_table(result: ChoiceResult) -> str:
    """The demo's table (Markdown): accuracy ± 95 % CI over the seeds and, per arm, privacy
    per kind of token; then the paired differences and the verdicts."""
    rows = {r["setting"]: r for r in result.rows}
    n = result.config["seeds"]
    out = [f"Accuracy (%) on {result.config['test_size']} SST-2 test queries, mean ± 95 % CI "
           f"over {n} paired seeds; privacy (%): 1 − nearest-neighbour inversion's recovery of "
           "the test queries' tokens (all tokens / rare words / personal data), an upper bound.",
           "", "| setting | accuracy | privacy: all | rare words | personal data |",
           "|---|---|---|---|---|"]
    for arm in ARMS:
        pr = result.arms.get(arm, {}).get("privacy", {})
        priv = " | ".join(_fmt(pr.get(k)) for k in KINDS)
        out.append(f"| {remote_name(arm)} | {_pm(rows[remote_name(arm)])} | {priv} |")
        out.append(f"| {fused_name(arm)} | {_pm(rows[fused_name(arm)])} | {priv} |")
    out.append(f"| {LOCAL} | {_pm(rows[LOCAL])} | nothing sent | nothing sent | nothing sent |")
    out += ["", "; ".join(_level(arm, result.arms[arm]) for arm in ARMS if arm in result.arms)
            + "."]
    out += ["", "| paired difference (points) | mean ± 95 % CI |", "|---|---|"]
    out += [f"| {k} | {_diff(d)} |" for k, d in result.paired.items()]
    return "\n".join(out)


def _level(arm: str, rec: dict) -> str:
    level = f"η {numfmt.eta(rec['eta'])} (P ≈ {rec['target_p']:g} on public text)"
    if arm == "uniform":
        return f"uniform: every token at {level}"
    personal = (rec.get("class_eta") or {}).get("personal")
    how = ("η 0 (each token swapped for a random one)" if personal == 0 else
           "the same η" if personal in (None, rec["eta"]) else f"η {numfmt.eta(personal)}")
    rank = rec.get("personal_rank")
    beyond = "" if rank is None else f" and words outside the {rank:,} most frequent"
    return (f"by kind (`--protect rare`, rapt's default): rare words at {level}, personal data"
            f"{beyond} at {how}, frequent words in clear")


def verdict_lines(result: ChoiceResult) -> list[str]:
    return [f"{arm}: {v}" for arm, v in result.verdicts.items()]


def make_plot(result: ChoiceResult):
    """Accuracy against privacy per kind of token: one panel per kind, each arm's privatized
    and fused models as points with their CIs, the local model as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {r["setting"]: r for r in result.rows}
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
    for ax, kind in zip(axes, KINDS, strict=True):
        for arm, color in zip(ARMS, ("tab:blue", "tab:orange"), strict=True):
            x = result.arms.get(arm, {}).get("privacy", {}).get(kind)
            if x is None:
                continue
            for name, marker in ((remote_name(arm), "o"), (fused_name(arm), "s")):
                r = rows[name]
                ax.errorbar(100 * x, 100 * r["accuracy"], yerr=100 * r["ci95"], fmt=marker,
                            color=color, capsize=3, label=name)
        ax.axhline(100 * rows[LOCAL]["accuracy"], color="gray", ls="--", label=LOCAL)
        ax.set_xlabel(f"privacy, {kind} tokens (%)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (%)")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.suptitle("rapt demo: accuracy against privacy per kind of token "
                 "(nearest-neighbour inversion)", fontsize=10)
    fig.tight_layout()
    return fig
