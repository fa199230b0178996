"""The main job behind ``rapt demo``: RAPT end to end on a small SST-2 subset, in the regime
``benchmarks/bench_rapt.py`` measures, on a few paired seeds.

1. The user side tokenizes sentences, inserts the plain tokens k and privatizes every token
   with the dχ-privacy mechanism at η (calibrated to a target replacement probability P on
   public text unless η is given). The rows without k are the same privatized rows with k cut
   out (the mechanism noises tokens independently), so +privatization and +reconstruction see
   the same privatized text and the same truncation: the comparison is paired.
2. The provider side tunes a prefix through a frozen label-description head (the prompt has to
   carry the task; a trainable linear head would be a linear probe that L_rec cannot help) in
   four settings: no privacy, head only (the prefix at its init: what the head alone scores),
   +privatization, and +reconstruction (eq. 7's summed L_rec; the reconstruction head is
   dropped afterwards).
3. Inference privatizes each test query the same way (same η) before prediction.
4. The embedding inversion attack scores what the provider could recover from the tokens.
5. Per setting: mean accuracy ± 95 % CI over the seeds, and one verdict line from the paired
   difference +reconstruction − +privatization (rapt.stats, the benchmark's rule).
6. With a channel model from ``rapt adapt`` (``channel``), a fifth setting,
   +denoise-then-tune: the +privatization rows and queries read back by it (through
   :class:`rapt.pipeline.Customization`) before tuning and predict, and a second verdict line:
   the share of the privatization gap (no privacy − +privatization) it wins back, paired.
7. The user's side (:mod:`rapt.local`), what the user could do alone: a TF-IDF + logistic
   regression on the clean training rows, scored on the clean test queries, and the fused
   row, +privatization's probabilities and the local ones in one pool whose two weights are
   cross-fitted on the test rows (fitted on one half, scored on the other, and the other way
   round: no row is scored with weights fitted on its own label, and the prompt never trained
   on any of them). Neither sends anything more than +privatization does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rapt import numfmt
from rapt.config import (
    DEFAULT_PLAIN_TOKENS,
    DEFAULT_PRIVATIZER_MODE,
    PRECISIONS,
    TuneConfig,
    tune_config,
)
from rapt.pipeline import plain_tokens_for  # noqa: F401  (re-exported: benchmarks use it)
from rapt.privacy.attack_table import ep_phrase
from rapt.privacy.rule import DEFAULT_TARGET_P
from rapt.stats import effect_word, gap_won_back, mean_ci, paired_difference

if TYPE_CHECKING:
    from rapt.channel.model import ChannelModel

SETTINGS = ("no privacy", "head only", "+privatization", "+reconstruction")
LOCAL_SETTING = "local TF-IDF (clean, on your machine)"
FUSED_SETTING = "fused (+privatization × local)"
LOCAL_SETTINGS = (LOCAL_SETTING, FUSED_SETTING)  # the user's side: nothing more is sent
CHANNEL_SETTING = "+denoise-then-tune"  # only with a channel model (a denoiser)
ADAPTER_SETTING = "+channel adapter"  # only with a channel adapter
NO_CHANNEL_LINE = ("no channel model given: `rapt adapt` builds one for this backbone from "
                   "public text (provider side), and `rapt demo --channel FOLDER` adds a "
                   f"{CHANNEL_SETTING} row and how much of the privatization gap it wins back")


@dataclass
class DemoConfig:
    """Defaults: the benchmark's regime (prefix tuning, frozen label-description head, m = 40,
    eq. 7's summed L_rec, text cut where 95 % of training rows stay whole) sized to finish in
    under 3 minutes on 2 quiet CPU cores in bf16 (measured: 2.6 min over 3 runs on
    AVX512-BF16, benchmarks/results/wallclock.json "demo-train600"): 3 paired seeds of 150
    optimizer steps (600 rows, 2 epochs). At 120 steps the prefix barely trains. The verdict
    at P 0.6 is 'no significant difference' or 'hurt' from one run to the next, always
    negative, at 150 steps (-1.2 to -2.1 points) as at 200 (800 rows: -2.9 to -5.7 points,
    3.6-4.0 min in bf16, 4.7 min in fp32).
    Privatized at P ≈ :data:`rapt.privacy.rule.DEFAULT_TARGET_P`, a level the weak-privacy
    rule does not flag.
    ``DemoConfig.benchmark()`` is ``benchmarks/bench_rapt.py``'s cpu profile at P 0.4."""

    backbone: str = "minilm"
    dataset: str = "sst2-sentences"
    train_size: int = 600
    test_size: int = 500
    max_length: int | None = None  # tokens per row, [CLS]/[SEP] in, k out; None: whole_fraction
    whole_fraction: float = 0.95
    method: str = "prefix"
    num_virtual_tokens: int = 10
    lr: float | None = None  # None: rapt.config.DEFAULT_LR[method]
    epochs: int = 2
    batch_size: int = 8
    plain_len: int = DEFAULT_PLAIN_TOKENS
    plain_sequences: int = 1  # > 1: each training row gets one of that many plain sequences
    target_p: float = DEFAULT_TARGET_P
    eta: float | None = None  # overrides target_p
    rec_weight: float = 1.0
    rec_reduction: str = "sum"  # eq. 7; "mean" divides by the number of positions
    head: str = "auto"  # RAPT's: label-description (encoders), verbalizer (causal LMs) | linear
    label_descriptions: list[str] | None = None  # None: the built-in dataset's
    seeds: int = 3  # paired seeds seed, seed + 1, ...
    seed: int = 0  # data subset (fixed) and the first seed's init, order and plain tokens
    noise_seed: int | None = None  # privacy noise: OS entropy unless set (then "seeded")
    privatizer_mode: str = DEFAULT_PRIVATIZER_MODE
    channel: str | None = None  # a channel model folder (rapt adapt): adds +denoise-then-tune
    # noise by kind of token (rapt.privacy.by_kind): the classes that get η ("all": uniform),
    # where "frequent" ends, and the others' level (P on the public sample, or η; neither: clear)
    protect: str = "all"
    frequent_rank: int = 1000
    other_p: float | None = None
    other_eta: float | None = None
    # personal data's own level (P, 1: η 0; or η): None, the protected η
    personal_p: float | None = None
    personal_eta: float | None = None
    personal_rank: int | None = None  # rare words beyond it get personal data's η (0: off)
    # Backbone passes (rapt.precision): auto = bf16 on CPUs with native bf16. In this very
    # setting bf16 and fp32 scored the same (-0.0 ± 0.2 points, 5 paired seeds:
    # benchmarks/results/precision.md) at 1.8x the prefix step speed.
    precision: str = "auto"

    def __post_init__(self) -> None:
        for name in ("train_size", "test_size", "epochs", "batch_size", "seeds",
                     "num_virtual_tokens", "plain_len"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"DemoConfig.{name} must be >= 1 (got {getattr(self, name)})")
        if self.max_length is not None and self.max_length < 3:
            raise ValueError(f"DemoConfig.max_length must be >= 3 text tokens "
                             f"(got {self.max_length})")
        if not 0 < self.whole_fraction <= 1:
            raise ValueError(f"DemoConfig.whole_fraction must lie in (0, 1] "
                             f"(got {self.whole_fraction})")
        if self.precision not in PRECISIONS:
            raise ValueError(f"DemoConfig.precision must be one of {', '.join(PRECISIONS)} "
                             f"(got {self.precision!r})")
        from rapt.privacy.by_kind import KindPolicy

        KindPolicy(self.protect, self.frequent_rank, self.other_eta,
                   self.personal_eta, self.personal_rank or None)  # ValueError naming it
        if self.personal_p is not None and not 0 < self.personal_p <= 1:
            raise ValueError(f"DemoConfig.personal_p must lie in (0, 1] (got {self.personal_p})")
        if self.other_p is not None and not 0 < self.other_p < 1:
            raise ValueError(f"DemoConfig.other_p must lie strictly between 0 and 1 "
                             f"(got {self.other_p})")
        if self.eta is None and not 0 < self.target_p < 1:
            raise ValueError(f"DemoConfig.target_p must lie strictly between 0 and 1 "
                             f"(got {self.target_p})")

    @classmethod
    def benchmark(cls, **overrides: Any) -> DemoConfig:
        """benchmarks/bench_rapt.py's cpu profile at P 0.4: 1,000 training / 400 test rows,
        4 epochs at batch 8 (500 steps), 5 paired seeds (about 40 minutes on 2 cores)."""
        return replace(cls(train_size=1000, test_size=400, epochs=4, seeds=5, target_p=0.4),
                       **overrides)


@dataclass
class DemoResult:
    config: dict
    eta: float
    p: float  # measured replacement probability on the training text, mean over seeds
    inversion_privacy: float  # 1 − inversion_success
    inversion_success: float = 0.0  # nearest-neighbour inversion on the first seed's queries
    target_p: float | None = None  # the P η was calibrated for (None: η given)
    seeded: bool = False
    rows: list[dict] = field(default_factory=list)  # one per setting, accuracies per seed
    paired: dict = field(default_factory=dict)  # +reconstruction − +privatization
    verdict: str = ""
    text_length: int = 0
    head: str = ""  # the head the runs used (config.head resolved)
    rows_whole: float = 1.0
    seconds: float = 0.0
    # With a channel model: its fingerprint and provenance, its recovery on the first seed's
    # test queries ("privacy") and the gap won back (rapt.stats.gap_won_back).
    channel: dict = field(default_factory=dict)
    channel_verdict: str = ""
    stage_seconds: dict = field(default_factory=dict)  # StageTimes.seconds

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class StageTimes:
    """Wall-clock seconds per stage of a run, summed over the seeds, in first-seen order."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def time(self, stage: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t

    def line(self) -> str:
        """'time per stage: backbone 2 s, data 1 s, ...'."""
        return "time per stage: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())


def _accuracy(pred: list[int], gold: list[int]) -> float:
    return float(sum(int(a == b) for a, b in zip(pred, gold, strict=True))) / max(1, len(gold))


def _tune_config(config: DemoConfig, bb, label_names: list[str]) -> TuneConfig:
    """The settings' common TuneConfig (each run sets its seed, length, reconstruction and
    freeze). "auto" is RAPT's head: the verbalizer over a causal LM's head, the frozen
    label-description head on an encoder; the demo refuses to fall back to a linear probe,
    which L_rec cannot help."""
    from rapt.tuning.tune import resolve_head

    cfg = tune_config(dict(method=config.method, num_virtual_tokens=config.num_virtual_tokens,
                           lr=config.lr, epochs=config.epochs, batch_size=config.batch_size,
                           rec_weight=config.rec_weight, rec_reduction=config.rec_reduction,
                           precision=config.precision, head=config.head,
                           label_descriptions=config.label_descriptions),
                      kind=bb.kind, label_names=label_names, dataset=config.dataset)
    if config.head == "auto" and resolve_head(bb.kind, cfg) == "linear":
        raise ValueError(f"{config.dataset}: no built-in label descriptions; give "
                         "label_descriptions (one text per label) or head='linear'")
    return cfg


@dataclass
class _Tally:
    """What the seeds add up: accuracies and run facts per setting, training-row P per seed."""

    settings: tuple[str, ...] = SETTINGS
    acc: dict[str, list[float]] = field(init=False)
    info: dict[str, dict] = field(init=False)
    ps: list[float] = field(default_factory=list)
    stages: StageTimes = field(default_factory=StageTimes)

    def __post_init__(self) -> None:
        self.acc = {s: [] for s in self.settings}
        self.info = {s: {} for s in self.settings}


def run_demo(config: DemoConfig, log: Callable[[str], None] = print,
             progress: Callable[[str, dict], None] | None = None,
             backbone: Any = None, channel: Any = None) -> DemoResult:
    """Run the demo; ``progress(setting, step_record)`` is called after each training step
    (the setting named "<setting>, seed <s>"). ``channel``: a channel model (a
    ``rapt.channel.denoiser.Denoiser``) instead of loading ``config.channel``."""
    from rapt.models import load_backbone
    from rapt.pipeline import Customization

    t0, stages = time.perf_counter(), StageTimes()
    with stages.time("backbone"):
        bb = backbone if backbone is not None else load_backbone(config.backbone)
        den = channel if channel is not None else _load_channel(config, bb)
    with stages.time("data"):
        train, test = _demo_data(config, log)
        base = _tune_config(config, bb, list(train.label_names))
        n_text, whole = _text_length(config, bb.tokenizer, train.texts, log)
    with stages.time("calibration"):
        custom = Customization.create(bb, eta=config.eta,
                                      target_p=config.target_p if config.eta is None else None,
                                      noise_seed=config.noise_seed,
                                      privatizer_mode=config.privatizer_mode)
        custom.kind_policy = _kind_policy(config, bb, custom.eta)
    if config.eta is None:  # the calibration every command uses
        log(f"η = {numfmt.eta(custom.eta)} (calibrated for P ≈ {config.target_p} on the public "
            "text sample)")
    if custom.by_kind:
        log(f"noise by kind of token: {custom.kind_record()['class_eta']} (η by class; None: "
            "in clear)")
    result = DemoResult(config=asdict(config), eta=float(custom.eta), p=0.0,
                        inversion_privacy=0.0, seeded=custom.privatizer.seeded,
                        text_length=n_text, rows_whole=whole, target_p=custom.target_p)
    tally = _Tally((*SETTINGS, *([channel_setting(den)] if den is not None else []),
                    *LOCAL_SETTINGS), stages=stages)
    for i in range(config.seeds):
        _run_seed(custom, config, (train, test), n_text, base, config.seed + i, result, tally,
                  log, progress, den)
    result.p = sum(tally.ps) / len(tally.ps)
    for name in tally.settings:
        mean, ci = mean_ci(tally.acc[name])
        result.rows.append({"setting": name, "accuracy": mean, "ci95": ci,
                            "accuracies": tally.acc[name], **tally.info[name]})
    result.paired = paired_difference(tally.acc["+reconstruction"], tally.acc["+privatization"])
    result.verdict = verdict_line(result.paired, config.target_p if config.eta is None
                                  else None, result.p)
    log(result.verdict)
    if den is not None:
        _channel_summary(result, tally, den, config)
        log(result.channel_verdict)
    else:
        log(NO_CHANNEL_LINE)
    result.seconds = time.perf_counter() - t0
    result.stage_seconds = dict(stages.seconds)
    log(stages.line())
    return result


def _kind_policy(config: DemoConfig, bb, eta: float) -> Any:
    """The demo's KindPolicy (None: uniform); the unprotected η (and personal data's) calibrated
    for ``config.other_p`` (``personal_p``) on the public text sample as η is; ValueError naming
    the field when one lies on the wrong side of η."""
    from rapt.privacy.by_kind import KindLevelError, make_policy
    from rapt.privacy.mechanism import calibrate_eta_public

    try:
        return make_policy(eta, config.protect, config.frequent_rank, other_p=config.other_p,
                           other_eta=config.other_eta, personal_p=config.personal_p,
                           personal_eta=config.personal_eta,
                           personal_rank=config.personal_rank,
                           calibrate=lambda p: calibrate_eta_public(bb, p))
    except KindLevelError as e:
        name = f"{e.level}_p" if getattr(config, f"{e.level}_p") is not None else f"{e.level}_eta"
        raise ValueError(f"DemoConfig.{name}: {e}") from None


def _load_channel(config: DemoConfig, bb) -> ChannelModel | None:
    """The channel model in ``config.channel`` rebuilt on ``bb`` (None without one);
    ValueError naming the folder when it is not one, or not one for ``bb``."""
    if config.channel is None:
        return None
    from rapt.channel.load import load_channel_model

    try:
        return load_channel_model(config.channel, bb)
    except ValueError as e:  # ArtifactError too
        raise ValueError(f"channel {config.channel}: {e}") from None


def _channel_summary(result: DemoResult, tally: _Tally, den: Any, config: DemoConfig) -> None:
    """The channel model's fingerprint and provenance, the gap it wins back (paired over the
    seeds) and its verdict line."""
    from rapt.channel.model import channel_fingerprint

    name = channel_setting(den)
    won = gap_won_back(tally.acc[name], tally.acc["+privatization"], tally.acc["no privacy"])
    result.channel.update({"folder": config.channel, "fingerprint": channel_fingerprint(den),
                           "provenance": dict(den.meta), "won_back": won, "setting": name})
    result.channel_verdict = channel_verdict_line(
        won, config.target_p if config.eta is None else None, result.p, name)


def _demo_data(config: DemoConfig, log: Callable[[str], None]):
    """(train, test): the seeded subsets of the demo's dataset."""
    from rapt.data import load_dataset

    train = load_dataset(config.dataset, "train")
    test = load_dataset(config.dataset, "dev" if config.dataset.startswith("sst2") else "test")
    train = train.subset(min(config.train_size, len(train)), seed=config.seed)
    test = test.subset(min(config.test_size, len(test)), seed=config.seed)
    log(f"data: {len(train)} training / {len(test)} test examples of {config.dataset}")
    return train, test


def _text_length(config: DemoConfig, tok, texts: list[str],
                 log: Callable[[str], None]) -> tuple[int, float]:
    """(text tokens per row, share of training rows whole). One text length for every setting
    (the rows with k are m tokens longer), so no setting sees more of a sentence than another."""
    from rapt.tuning.reconstruction import text_length_for

    n_text, whole = text_length_for(tok, texts, config.whole_fraction)
    if config.max_length is not None:
        n_text = config.max_length
        whole = sum(len(r) <= n_text for r in tok(texts)["input_ids"]) / len(texts)
    log(f"rows cut at {n_text} tokens, specials included ({whole:.0%} of training rows whole) + "
        f"{config.plain_len} plain tokens")
    return n_text, whole


def _run_seed(custom, config: DemoConfig, data, n_text: int, base: TuneConfig, seed: int,
              result: DemoResult, tally: _Tally, log: Callable[[str], None],
              progress: Callable[[str, dict], None] | None, channel: Any = None) -> None:
    """One paired seed: privatize the rows with k once, cut k out for the settings without
    it, and tune and score every setting on that same draw (+denoise-then-tune: the
    +privatization rows and queries, read back by ``channel``)."""
    from rapt.pipeline import Encoding
    from rapt.privacy.attack_table import table_line
    from rapt.privacy.mechanism import replacement_probability

    (train, test), m, tok = data, config.plain_len, custom.backbone.tokenizer
    with_k = replace(custom, encoding=Encoding.sampled(tok, n_text + m, m,
                                                       config.plain_sequences, len(train), seed))
    k_rows, k_test = with_k.rows(train.texts), with_k.rows(test.texts, queries=True)
    with tally.stages.time("privatization"):
        priv_k = with_k.privatize(k_rows, measure=False, texts=train.texts)
        priv_k_test = with_k.privatize(k_test, measure=False, texts=test.texts)
    cut = with_k.encoding.text_only
    clean = (cut(tok, k_rows), cut(tok, k_test))
    priv = (cut(tok, priv_k), cut(tok, priv_k_test))
    tally.ps.append(replacement_probability(clean[0], priv[0], custom.backbone.special_ids))
    first = not tally.acc["no privacy"]
    if first:
        with tally.stages.time("inversion attack"):
            result.inversion_success = float(
                with_k.measure(k_test, priv_k_test)["inversion_success"])
        result.inversion_privacy = 1.0 - result.inversion_success
        log(f"privatized with η = {numfmt.eta(result.eta)}: measured P = "
            f"{numfmt.p(tally.ps[0])} (training rows); nearest-neighbour inversion recovers "
            f"{result.inversion_success:.1%} of the test queries' tokens (empirical privacy "
            f"{result.inversion_privacy:.3f})")
        log(table_line(custom.backbone.name, result.eta))
    if first and channel is not None and channel.attacker is not None:
        with tally.stages.time("channel attack"):
            _channel_privacy(replace(custom, channel=channel), clean[1], priv[1], result, log)
    runs = [("no privacy", clean, False, False), ("head only", priv, False, True),
            ("+privatization", priv, False, False),
            ("+reconstruction", (priv_k, priv_k_test), True, False)]
    if channel is not None:
        runs.append((channel_setting(channel), priv, False, False))
    remote = None
    for name, (rows, test_rows), rec, freeze in runs:
        t = time.perf_counter()
        cfg = replace(base, seed=seed, max_length=n_text + (m if rec else 0),
                      reconstruction=rec, freeze_prompt=freeze)
        run = replace(with_k if rec else custom, config=cfg,
                      channel=channel if name in (CHANNEL_SETTING, ADAPTER_SETTING) else None)
        cb = (lambda r, name=f"{name}, seed {seed}": progress(name, r)) \
            if progress is not None else None
        with tally.stages.time("tuning"):
            tuned = run.tune(rows, train.labels, len(train.label_names), progress=cb)
        with tally.stages.time("prediction"):
            proba = run.predict_proba(test_rows).float().cpu().numpy()
            a = _accuracy(proba.argmax(-1).tolist(), test.labels)
        remote = proba if name == "+privatization" else remote
        tally.acc[name].append(a)
        _record(tally.info[name], tuned, time.perf_counter() - t, first, rec)
        result.head = tuned.meta["head"]
        log(f"seed {seed}: {name:16s} accuracy {numfmt.pct(a)}  "
            f"({time.perf_counter() - t:.0f} s)")
    _user_side(train, test, remote, seed, tally, log)


def _user_side(train, test, remote, seed: int, tally: _Tally,
               log: Callable[[str], None]) -> None:
    """The local model on the clean training rows, scored on the clean test queries, and its
    pool with +privatization's probabilities ``remote`` (weights cross-fitted)."""
    import numpy as np

    from rapt.local import LocalBaseline
    from rapt.local.fusion import cross_fitted

    t = time.perf_counter()
    with tally.stages.time("local model"):
        base = LocalBaseline.fit(train.texts, train.labels, len(train.label_names),
                                 text_pairs=_pairs(train), seed=seed)
        local = base.predict_proba(test.texts, _pairs(test))
        y = np.asarray(test.labels)
        fused = cross_fitted(remote, local, y, seed=seed)
    for name, p in ((LOCAL_SETTING, local), (FUSED_SETTING, fused)):
        tally.acc[name].append(_accuracy(p.argmax(-1).tolist(), test.labels))
        log(f"seed {seed}: {name} accuracy {numfmt.pct(tally.acc[name][-1])}  "
            f"({time.perf_counter() - t:.1f} s)")


def _pairs(ds) -> list | None:
    pairs = ds.text_pairs
    return pairs if any(p is not None for p in pairs) else None


def _channel_privacy(custom, clean: list, private: list, result: DemoResult,
                     log: Callable[[str], None]) -> None:
    """The channel model as an attacker on the first seed's privatized test queries (it never
    sees the clean ones; they only score it)."""
    ch = custom.measure(clean, private)["channel"]
    result.channel["privacy"] = ch
    log(f"the channel model, as an attacker, recovers {ch['recovery']:.1%} of the test queries' "
        f"tokens ({ch['recovery_replaced']:.1%} of the replaced ones): "
        f"{ep_phrase(ch['empirical_privacy'], ch['strongest_attacker'])}; post-processing, the "
        "formal guarantee at η is unchanged")


def _record(d: dict, tuned: Any, seconds: float, first: bool, rec: bool) -> None:
    """A setting's run facts: steps, training time, the first seed's loss curve and, with
    reconstruction, L_rec's accuracy over the last fifth of the steps."""
    hist = tuned.meta["history"]
    d["steps"] = tuned.meta["steps"]
    d["train_seconds"] = d.get("train_seconds", 0.0) + seconds
    if first:
        d["loss_curve"] = [h["loss"] for h in hist]
        # apart: L_rec (summed over m positions) is ~100x the task loss and flattens it
        d["task_curve"] = [h.get("task_loss", h["loss"]) for h in hist]
        if rec:
            d["rec_curve"] = [h["rec_loss"] for h in hist if "rec_loss" in h]
    if rec and hist:
        tail = hist[-max(1, len(hist) // 5):]
        d.setdefault("rec_acc_end", []).append(
            sum(h.get("rec_acc", 0.0) for h in tail) / len(tail))


def _level(target_p: float | None, p: float) -> str:
    return f"P≈{target_p}" if target_p is not None else f"P={p:.2f}"


def _diff_text(d: dict) -> str:
    """'+1.2 ± 0.8 points (95 % CI, 3 paired seeds' — or, with one seed, no interval."""
    if d["n"] < 2:
        return f"{100 * d['mean_diff']:+.1f} points (1 seed: no CI, give --seeds 2 or more"
    return (f"{100 * d['mean_diff']:+.1f} ± {100 * d['ci95']:.1f} points (95 % CI, {d['n']} "
            "paired seeds")


def verdict_line(d: dict, target_p: float | None, p: float) -> str:
    """One line from the paired difference (the benchmark's rule: the 95 % CI must exclude 0)."""
    return (f"reconstruction {effect_word(d)} here: +reconstruction − +privatization = "
            f"{_diff_text(d)}, {_level(target_p, p)})")


def channel_setting(channel: ChannelModel) -> str:
    """The demo row of a channel model: +denoise-then-tune or +channel adapter."""
    return f"+{channel.remedy}"


def channel_verdict_line(won: dict, target_p: float | None, p: float,
                         setting: str = CHANNEL_SETTING) -> str:
    """The channel row's line from :func:`rapt.stats.gap_won_back`: its paired difference to
    +privatization (same rule as :func:`verdict_line`) and the share of the gap it wins back."""
    d, g = won["diff"], won["gap"]
    share = (f"{won['share']:.0%} of the privatization gap" if g["mean_diff"] > 0
             else "nothing: there is no privatization gap here")
    gap = (f"{100 * g['mean_diff']:+.1f} ± {100 * g['ci95']:.1f} points" if g["n"] > 1
           else f"{100 * g['mean_diff']:+.1f} points")
    return (f"{setting.lstrip('+')} {effect_word(d)} here: {setting} − +privatization = "
            f"{_diff_text(d)}, {_level(target_p, p)}); it wins back {share} (no privacy − "
            f"+privatization = {gap})")


def format_table(result: DemoResult) -> str:
    """A small Markdown table of the demo's numbers, then the verdict line."""
    one = all(len(r["accuracies"]) < 2 for r in result.rows)  # one seed: no interval
    lines = ["| setting | accuracy (" + ("1 seed, no CI" if one else "mean ± 95 % CI, points")
             + ") | per seed | P | inversion empirical privacy |", "|---|---|---|---|---|"]
    for r in result.rows:
        private = r["setting"] != "no privacy"
        seeds = ", ".join(numfmt.pct(a) for a in r["accuracies"])
        acc = numfmt.pct(r["accuracy"]) + ("" if one else f" ± {numfmt.points(r['ci95'])}")
        lines.append(f"| {r['setting']} | {acc} | {seeds} | "
                     + ("nothing sent | - |" if r["setting"] == LOCAL_SETTING else
                        f"{numfmt.p(result.p)} | {result.inversion_privacy:.3f} |" if private
                        else "0 | 0 |"))
    c = result.config
    steps = next((r.get("steps", 0) for r in result.rows if r["setting"] == "+privatization"), 0)
    lines += ["", f"{c['method']} tuning of {c['backbone']} (head: {result.head}) on "
              f"{c['train_size']} {c['dataset']} sentences, {steps} steps per run, "
              f"η = {numfmt.eta(result.eta)}, {c['plain_len']} plain tokens, rows cut at "
              f"{result.text_length} tokens with specials ({result.rows_whole:.0%} whole), "
              f"{c['seeds']} paired seeds; {result.seconds:.0f} s in all. Head only = the "
              "prefix kept at its init (only a trainable head, if any, trains).",
              "", f"{LOCAL_SETTING} = TF-IDF + logistic regression fitted on the clean "
              "training rows, scored on the clean test queries: what you could do without "
              f"sending anything. {FUSED_SETTING} = +privatization's probabilities (privatized "
              "queries, so it sends what +privatization sends) and the local ones in one "
              "log-linear pool, its two weights fitted on four fifths of the test rows and "
              "scored on the fifth left out, fold by fold, as `rapt tune` fits them on its "
              "held-out slice (the prompt never trained on these rows).",
              "", result.verdict]
    if result.stage_seconds:
        lines[-2:-2] = ["", StageTimes(dict(result.stage_seconds)).line() + "."]
    ch = result.channel
    if ch and ch.get("setting") == ADAPTER_SETTING:
        lines += [result.channel_verdict, "",
                  f"{ADAPTER_SETTING} = +privatization tuned and scored on the backbone with the "
                  f"channel adapter {ch['fingerprint'][:12]} merged in (distilled on public text; "
                  "it never sees the clean text). It outputs no tokens, so the attackers are the "
                  "table's (the inversion column is nearest neighbour's; the dχ guarantee at η "
                  "is unchanged)."]
    elif ch:
        priv = ch.get("privacy") or {}
        lines += [result.channel_verdict, "",
                  f"{CHANNEL_SETTING} = +privatization with the training rows and test queries "
                  f"read back by the channel model {ch['fingerprint'][:12]} (built on public "
                  "text; it never sees the clean text). The same model is an attacker: it "
                  f"recovers {priv.get('recovery', 0):.1%} of the test queries' tokens; "
                  f"{ep_phrase(priv.get('empirical_privacy', 0), priv.get('strongest_attacker'))}"
                  " (the inversion column is nearest neighbour's; the dχ guarantee at η is "
                  "unchanged)."]
    return "\n".join(lines)


def _loss_panel(ax, rows: list[dict]) -> None:
    """Seed-0 task loss per setting on the left axis; L_rec, two orders of magnitude larger
    (summed over the m plain positions), on its own right axis so it does not flatten them."""
    for r in rows:
        curve = r.get("task_curve") or r.get("loss_curve")
        if curve:
            ax.plot(curve, label=f"{r['setting']}: task loss")
    ax.set_xlabel("step (first seed)")
    ax.set_ylabel("task loss (cross-entropy)")
    handles, labels = ax.get_legend_handles_labels()
    recs = [r for r in rows if r.get("rec_curve")]
    if recs:
        twin = ax.twinx()
        for r in recs:
            twin.plot(r["rec_curve"], ls=":", color="gray", label=f"{r['setting']}: L_rec")
        twin.set_ylabel("L_rec (reconstruction, right axis)")
        h2, l2 = twin.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, fontsize=7)


def make_plot(result: DemoResult):
    """Accuracy bars with CIs (seeds as dots) and seed-0 training-loss curves -> Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["setting"] for r in result.rows]
    means = [r["accuracy"] for r in result.rows]
    palette = {LOCAL_SETTING: "#ff7f0e", FUSED_SETTING: "#9467bd"}
    colors = [palette.get(n) or ["#999999", "#cccccc", "#d62728", "#2ca02c", "#1f77b4"][j]
              for j, n in enumerate(names)]
    short = {LOCAL_SETTING: "local TF-IDF (clean)", FUSED_SETTING: "fused (+priv. × local)"}
    ax1.bar([short.get(n, n) for n in names], means, yerr=[r["ci95"] for r in result.rows],
            capsize=4, color=colors)
    for j, r in enumerate(result.rows):
        ax1.plot([j] * len(r["accuracies"]), r["accuracies"], "k.", alpha=0.6)
        ax1.text(j, min(1.0, means[j] + r["ci95"] + 0.02), f"{means[j]:.3f}", ha="center")
    ax1.set_ylim(0, 1.05)
    ax1.set_ylabel("test accuracy (privatized queries; local: clean)")
    ax1.set_title(f"η = {numfmt.eta(result.eta)}, P = {numfmt.p(result.p)}, "
                  f"inversion privacy = {result.inversion_privacy:.2f}", fontsize=10)
    plt.setp(ax1.get_xticklabels(), rotation=20, ha="right", fontsize=7)
    _loss_panel(ax2, result.rows)
    fig.suptitle(result.verdict, fontsize=8)
    fig.tight_layout()
    return fig
