"""The one set of tuning and privatization defaults.

``TuneConfig`` (the trainer's settings) is the single source: `rapt tune`, `rapt client tune`,
``RaptClient`` and the service's ``JobCreate`` read their defaults from its field defaults and
from the per-method tables below, instead of repeating literals. This module imports no torch,
so the CLI can read the defaults when it builds its options (``rapt --help`` stays fast).
``rapt.tuning.tune`` re-exports everything here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Literal

METHODS: tuple[str, ...] = ("prompt", "prefix", "lora", "full")
HEADS: tuple[str, ...] = ("auto", "linear", "label-description", "verbalizer")
# Forward-pass precision (rapt.precision): "auto" is bf16 on a CPU with native bf16, else fp32.
PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16")
PRECISION_HELP = ("backbone forward passes: fp32 | bf16 (bfloat16 autocast; heads, losses, DP "
                  "clipping and noise and privatization stay fp32) | auto (bf16 where the CPU "
                  "has AVX512-BF16 or AMX; else fp32, GPUs included)")

# The method a run gets when none is given, chosen from a measured table
# (benchmarks/results/defaults.md): on 2,000 rows of SST-2, FP and TREC, clean and at
# P 0.4, LoRA was the most accurate in 5 of 6 settings (TREC clean: 1.3 ± 1.9 points below
# prefix) and took 46-104 s; prompt tuning (150 virtual tokens) took 314-392 s and was not
# more accurate; prefix was 3-5 points lower on SST-2 and FP. On CB (250 pair rows) prefix
# learnt more than LoRA. PromptDPSGD clips per-example gradients of a prompt or prefix only,
# so a DP run without a method gets prefix.
DEFAULT_METHOD = "lora"
DP_DEFAULT_METHOD = "prefix"
DP_METHODS: tuple[str, ...] = ("prompt", "prefix")
# Per-method learning rates (AdamW, linear decay): prompt ≈ 1e-2..3e-2, prefix ≈ 5e-3..1e-2,
# LoRA ≈ 1e-3, full ≈ 2e-5 (the paper's 6e-5 is for BERT-base, 4 epochs at batch 128).
DEFAULT_LR: dict[str, float] = {"prompt": 2e-2, "prefix": 1e-2, "lora": 1e-3, "full": 3e-5}
# Virtual tokens: the RAPT paper's prompt length 150 (prompt tuning) and 10 (prefix tuning);
# LoRA and full tuning have none (the value is recorded but unused).
DEFAULT_VIRTUAL_TOKENS: dict[str, int] = {"prompt": 150, "prefix": 10, "lora": 20, "full": 20}
# Label-description head: cos / 0.05, the scale all-MiniLM-L6-v2 was trained with (see
# rapt.tuning.heads for the measurement behind it).
DEFAULT_TEMPERATURE = 0.05
# Nearest-neighbour search of the dχ mechanism: "fast" is certified exact (it returns what
# "exact" returns, faster), so every command and the client use it unless told otherwise.
DEFAULT_PRIVATIZER_MODE: Literal["exact", "fast", "annoy"] = "fast"
DEFAULT_PLAIN_TOKENS = 40  # RAPT §4.1: m = 40 plain tokens for reconstruction
# The η the dχ mechanism accepts (every command, the client, the service). Measured on the
# packaged backbones' public sample: P is 1.0 (MiniLM) and 0.998 (SmolLM2) at η = 1, and 0.0
# from η = 1e4 on; calibration lands between 7 and 170 for P in [0.01, 0.99]. Outside the range
# nothing changes but the arithmetic: 1/η overflows to inf (η 1e-320) or the noise vanishes.
ETA_MIN, ETA_MAX = 1e-3, 1e6


def eta_problem(eta: float) -> str | None:
    """Why ``eta`` cannot be a dχ privacy parameter (None: it can)."""
    if not (math.isfinite(eta) and ETA_MIN <= eta <= ETA_MAX):
        return (f"must be a finite number in [{ETA_MIN:g}, {ETA_MAX:g}] (got {eta!r}): below, "
                "every token is replaced at random already; above, none is")
    return None


METHOD_DEFAULT_HELP = ("default: lora, or prefix under DP, which covers prompt and prefix "
                       "only; chosen from benchmarks/results/defaults.md")


def default_method(dp: bool) -> str:
    """The tuning method a run gets when none is given (``dp``: a PromptDPSGD run)."""
    return DP_DEFAULT_METHOD if dp else DEFAULT_METHOD


def default_lr(method: str) -> float:
    """The learning rate a tuning method gets when none is given."""
    return DEFAULT_LR.get(method, DEFAULT_LR["prompt"])


def default_virtual_tokens(method: str) -> int:
    """The prompt / prefix length a tuning method gets when none is given."""
    return DEFAULT_VIRTUAL_TOKENS.get(method, DEFAULT_VIRTUAL_TOKENS["lora"])


def per_method(table: dict[str, Any], methods: tuple[str, ...] = METHODS) -> str:
    """'prompt 0.02, prefix 0.01, ...' for help texts."""
    return ", ".join(f"{m} {table[m]:g}" for m in methods if m in table)


# Help texts of the per-method options, shared by `rapt tune`, `rapt client tune`, JobCreate.
LR_HELP = f"default per method: {per_method(DEFAULT_LR)}"
VIRTUAL_TOKENS_HELP = ("default per method: "
                       f"{per_method(DEFAULT_VIRTUAL_TOKENS, ('prompt', 'prefix'))} (the RAPT "
                       "paper's; LoRA and full tuning use none)")


@dataclass
class TuneConfig:
    """Tuning settings. ``method`` left at None takes :func:`default_method`; ``lr`` and
    ``num_virtual_tokens`` left at None take the method's default (``DEFAULT_LR``,
    ``DEFAULT_VIRTUAL_TOKENS``) when the config is built."""

    # None: default_method(dp is not None), LoRA (prefix under DP)
    method: Literal["prompt", "prefix", "lora", "full"] | None = None
    num_virtual_tokens: int | None = None  # None: DEFAULT_VIRTUAL_TOKENS[method]
    prefix_projection: bool = False
    lr: float | None = None  # None: DEFAULT_LR[method]
    epochs: int = 3
    batch_size: int = 32
    max_length: int = 128
    seed: int = 0
    # Off by default: no accuracy gain measured at our scale (benchmarks/results/rapt.md) for
    # about twice the step time.
    reconstruction: bool = False
    rec_hidden: int = 96
    rec_vocab_size: int = 7630
    rec_weight: float = 1.0
    dp: Any = None  # rapt.dp.DPConfig | None
    # --- beyond the contract (all optional) ---
    rec_reduction: Literal["mean", "sum"] = "sum"  # "sum" = eq. 7 literally
    pooling: Literal["mean", "cls", "last"] = "mean"  # encoder head pooling
    label_words: list[str] | None = None  # causal LMs: verbalizer words, one per label
    lora_r: int = 8
    weight_decay: float = 0.0
    warmup_ratio: float = 0.06
    checkpoint_every: int = 0  # steps between checkpoint() calls; 0 = end of every epoch
    # Task head (see rapt.tuning.heads). "auto": the verbalizer for a causal LM given label_words,
    # the label-description head given label_descriptions, else a new linear head on pooled states
    # (a linear probe: the prompt barely matters; a control).
    head: Literal["auto", "linear", "label-description", "verbalizer"] = "auto"
    label_descriptions: list[str] | None = None  # one per label, e.g. "a negative review"
    head_temperature: float = DEFAULT_TEMPERATURE  # label-description head: cos / temperature
    # Head-only control: the prompt/prefix (or LoRA / full weights) stay at their init and only
    # the head trains; with a frozen head nothing trains and the result is the prompt at init.
    freeze_prompt: bool = False
    # Backbone forward passes (rapt.precision). fp32 stays the default until bf16 is shown
    # equal in accuracy (benchmarks/results/precision.md).
    precision: Literal["auto", "fp32", "bf16"] = "fp32"

    def __post_init__(self) -> None:
        if self.method is None:
            self.method = default_method(self.dp is not None)
        if self.method not in METHODS:
            raise ValueError(f"TuneConfig.method must be one of {', '.join(METHODS)} "
                             f"(got {self.method!r})")
        if self.lr is None:
            self.lr = default_lr(self.method)
        if self.num_virtual_tokens is None:
            self.num_virtual_tokens = default_virtual_tokens(self.method)
        for name in ("num_virtual_tokens", "epochs", "batch_size", "max_length", "rec_hidden",
                     "rec_vocab_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"TuneConfig.{name} must be >= 1 (got {getattr(self, name)})")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"TuneConfig.lr must be > 0 (got {self.lr})")
        if self.rec_weight < 0:
            raise ValueError(f"TuneConfig.rec_weight must be >= 0 (got {self.rec_weight})")
        if self.rec_reduction not in ("mean", "sum"):
            raise ValueError(f"TuneConfig.rec_reduction must be 'mean' or 'sum' "
                             f"(got {self.rec_reduction!r})")
        if self.head not in HEADS:
            raise ValueError(f"TuneConfig.head must be one of {', '.join(HEADS)} "
                             f"(got {self.head!r})")
        if not (self.head_temperature > 0 and math.isfinite(self.head_temperature)):
            raise ValueError(f"TuneConfig.head_temperature must be > 0 "
                             f"(got {self.head_temperature})")
        if self.label_descriptions is not None and (
                len(self.label_descriptions) < 2
                or any(not isinstance(d, str) or not d.strip() for d in self.label_descriptions)):
            raise ValueError("TuneConfig.label_descriptions must hold one non-empty text per "
                             f"label, at least 2 (got {self.label_descriptions!r})")
        if self.head == "label-description" and not self.label_descriptions:
            raise ValueError("TuneConfig.head='label-description' needs label_descriptions, one "
                             "text per label (e.g. ['a negative review', 'a positive review'])")
        if self.head == "verbalizer" and not self.label_words:
            raise ValueError("TuneConfig.head='verbalizer' needs label_words, one per label")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TuneConfig.precision must be one of {', '.join(PRECISIONS)} "
                             f"(got {self.precision!r})")

    def to_dict(self) -> dict:
        d = asdict(self) if self.dp is None else {**asdict(_replace_dp(self)), "dp": _dp_dict(
            self.dp)}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TuneConfig:
        d = known_fields(cls, d)
        if isinstance(d.get("dp"), dict):
            try:
                from rapt.dp import DPConfig

                # Clipping without noise, which rapt once accepted, guarantees nothing (ε = ∞,
                # as the artifact's meta["dp"] says): such a record loads as non-private.
                no_noise = d["dp"].get("noise_multiplier") == 0 and \
                    d["dp"].get("target_epsilon") is None
                d["dp"] = None if no_noise else DPConfig(**d["dp"])
            except ImportError:  # keep the record readable without the DP module
                pass
        return cls(**d)


def known_fields(cls: type, d: dict) -> dict:
    """A copy of ``d`` after checking that every key is a field of dataclass ``cls`` (a saved
    record from a newer version, or a typo, fails with the names instead of a TypeError)."""
    unknown = set(d) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {', '.join(sorted(unknown))}")
    return dict(d)


def tune_config(options: Mapping[str, Any], *, kind: str | None = None,
                label_names: Sequence[str] | None = None,
                dataset: str | None = None) -> TuneConfig:
    """The :class:`TuneConfig` of ``options`` (a command's, the demo's or a job's: keys that are
    no field are ignored; ``dp`` a ``DPConfig`` or a mapping of its fields, None values left
    out). Raises ValueError.

    With ``label_names`` (the data's, in id order) the head gets what it reads on a backbone of
    ``kind``: the label descriptions given, else the built-in ones of ``dataset`` on an
    encoder; the label words given, else the label names on a causal LM."""
    kwargs = {f.name: options[f.name] for f in fields(TuneConfig)
              if f.name in options and f.name != "dp"}
    dp = options.get("dp")
    if isinstance(dp, Mapping):
        from rapt.dp.config import DPConfig

        dp = DPConfig(**{f.name: dp[f.name] for f in fields(DPConfig)
                         if dp.get(f.name) is not None}) if dp else None
    if dp is not None:
        kwargs["dp"] = dp
    if label_names is not None:
        kwargs.update(_head_inputs(kwargs, kind, list(label_names), dataset))
    return TuneConfig(**kwargs)


def _head_inputs(kwargs: dict[str, Any], kind: str | None, names: list[str],
                 dataset: str | None) -> dict[str, Any]:
    """``label_descriptions`` and ``label_words`` for :func:`tune_config`, checked against the
    labels and the head."""
    from rapt.data import label_descriptions_for

    head = kwargs.get("head", "auto")
    descs = kwargs.get("label_descriptions") or (
        label_descriptions_for(dataset) if kind == "encoder" and dataset else None)
    if head == "label-description" and not descs:
        raise ValueError(f"head='label-description': {dataset} has no built-in label "
                         "descriptions; give label_descriptions '"
                         + "|".join(f"{n}=..." for n in names) + "'")
    if descs and head in ("auto", "label-description") and len(descs) != len(names):
        raise ValueError(f"label_descriptions: {len(descs)} given for {len(names)} labels "
                         f"({', '.join(names)})")
    words = kwargs.get("label_words") or (names if kind == "causal" else None)
    return {"label_descriptions": descs, "label_words": words}


def tune_default(name: str, method: str = DEFAULT_METHOD) -> Any:
    """The default of TuneConfig field ``name`` (per-method ones resolved for ``method``; the
    method itself is the one of a run without DP)."""
    if name == "method":
        return DEFAULT_METHOD
    if name == "lr":
        return default_lr(method)
    if name == "num_virtual_tokens":
        return default_virtual_tokens(method)
    f = next((f for f in fields(TuneConfig) if f.name == name), None)
    if f is None:
        raise KeyError(f"TuneConfig has no field {name!r}")
    return f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]


def _replace_dp(c: TuneConfig) -> TuneConfig:
    from dataclasses import replace

    return replace(c, dp=None)


def _dp_dict(dp: Any) -> dict:
    if hasattr(dp, "to_dict"):
        return dp.to_dict()
    return asdict(dp) if hasattr(dp, "__dataclass_fields__") else dict(dp)
