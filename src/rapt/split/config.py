"""Split-and-Privatize settings (SAP §4, §5.1)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

from rapt.config import DEFAULT_PRIVATIZER_MODE, PRECISIONS, eta_problem, known_fields
from rapt.privacy.cti import CTI_RULES, DEFAULT_SMOOTHING

__all__ = ["PRIVATIZE_MODES", "PROVIDER_FIELDS", "SPLIT_METHODS", "SplitConfig"]

SPLIT_METHODS: tuple[str, ...] = ("lora", "prompt")
PRIVATIZE_MODES: tuple[str, ...] = ("tokens", "output")
# What the provider needs to run and tune the top (a remote session's configuration). The
# rest stays with the customer: η and CTI (which tokens matter is a statistic of the labelled
# data), the noise seed, and the learning rates of the customer's own head and bottom.
PROVIDER_FIELDS: tuple[str, ...] = (
    "split_layer", "unfreeze_bottom", "method", "lora_r", "lora_alpha", "num_virtual_tokens",
    "pooling", "lr", "weight_decay", "warmup_ratio", "epochs", "batch_size", "max_length",
    "seed", "precision")


@dataclass
class SplitConfig:
    """What each party runs and trains.

    ``split_layer`` n: the customer's bottom is the embedding layer plus the first n
    transformer blocks (0 = embedding layer only, SAP Algorithm 1); the provider's top is the
    remaining blocks plus pooling. ``eta``: dχ privacy parameter on the token embeddings
    (None = no privatization, the "None" column of SAP Table 4). ``cti``: contributing-token
    identification from the customer's labelled rows; contributing tokens get η multiplied by
    ``cti_multiplier`` (``inf`` = no noise at all on them, as SAP Algorithm 1 does);
    ``cti_rule``: "uniform" (the paper's one k for all classes) or "per-class" (ours, not the
    paper's: each class fills the coverage budget on its own, :data:`rapt.privacy.cti.CTI_RULES`);
    ``cti_smoothing``: α of the add-α estimate in :func:`rapt.privacy.cti.utility_importance` (the
    paper gives none; 1 is ours, and α moves the uniform rule's k: :data:`DEFAULT_SMOOTHING`).
    ``privatize``: where the η noise goes. "tokens" (default, SAP Algorithm 1 at every depth):
    dχ noise on each token embedding, then the nearest vocabulary token, then the bottom's
    blocks. "output" (split_layer >= 1; SAP §4.1/§4.3, "privatizes the outputs of the bottom
    model"): the bottom runs on the clean ids and each released position's hidden state h gets
    z = l·v, l ~ Gamma(width, scale 1/η), v uniform on the sphere (density ∝ exp(−η‖z‖), the
    same sampler as the token mechanism, with the bottom's output width as the Gamma shape).
    What holds for "output": for two rows x, x' of equal length, every release satisfies
    P[M(x) ∈ S] ≤ exp(η·Σ_j ‖f_j(x) − f_j(x')‖)·P[M(x') ∈ S], f_j the bottom's state at
    position j: metric privacy in the bottom's output space, not in the token embeddings.
    Attention mixes positions, so changing one token moves every f_j and the whole row's
    distance counts; no per-token statement follows. A bottom ending in a LayerNorm (BERT-style)
    has ‖f_j‖ ≤ R, which gives plain ε-DP between equal-length rows with ε = 2ηRL: finite but
    far too large to mean anything; a Llama-style bottom ends in an unnormalised residual
    stream, so not even that. The token mode's guarantee (per token, in embedding distance)
    is the stronger statement; "output" is what the paper's Table 4 numbers imply.
    ``label_dp_epsilon``: train on labels randomized once by randomized response
    (:mod:`rapt.dp.label_dp`): every row's label is then ε-label-DP against the provider, who
    otherwise reads the labels off ∂l/∂g (:mod:`rapt.attacks.label_inference`); refused with
    ``cti`` (the contributing tokens are computed from the true labels). None = true labels.
    ``unfreeze_bottom``: the customer trains its bottom with the gradient the top returns, and
    privatizes afresh every iteration (SAP §5.3). ``method``: how the provider tunes the top
    ("lora" = peft LoRA on the attention query/value projections, the paper's choice;
    "prompt" = trainable vectors prepended at the top's input). ``seed`` drives weight init
    and data order only; the privacy noise is seeded only by ``noise_seed`` (None = OS
    entropy, as any real use must). ``precision``: the bottom's and the top's forward passes
    (:mod:`rapt.precision`: fp32, bf16 autocast, or auto); the released states, output noise,
    token privatization, head and loss stay fp32.
    """

    split_layer: int = 0
    eta: float | None = None
    cti: bool = False
    cti_multiplier: float = math.inf
    cti_coverage: float = 0.01
    cti_rule: Literal["uniform", "per-class"] = "uniform"
    cti_smoothing: float = DEFAULT_SMOOTHING
    privatize: Literal["tokens", "output"] = "tokens"
    label_dp_epsilon: float | None = None
    unfreeze_bottom: bool = False
    method: Literal["lora", "prompt"] = "lora"
    lora_r: int = 8
    lora_alpha: int = 16
    num_virtual_tokens: int = 10
    pooling: Literal["auto", "mean", "last"] = "auto"
    lr: float = 1e-3
    head_lr: float | None = None  # customer's output layer; None = lr
    bottom_lr: float | None = None  # customer's bottom when unfrozen; None = lr
    weight_decay: float = 0.0
    warmup_ratio: float = 0.06
    epochs: int = 3
    batch_size: int = 32
    max_length: int = 64
    seed: int = 0
    noise_seed: int | None = None
    privatizer_mode: Literal["exact", "fast", "annoy"] = DEFAULT_PRIVATIZER_MODE
    precision: Literal["auto", "fp32", "bf16"] = "fp32"

    def __post_init__(self) -> None:
        if isinstance(self.split_layer, bool) or not isinstance(self.split_layer, int) \
                or self.split_layer < 0:
            raise ValueError(f"SplitConfig.split_layer must be an integer >= 0 (the number of "
                             f"transformer blocks the customer runs), got {self.split_layer!r}")
        if self.eta is not None and eta_problem(self.eta):
            raise ValueError(f"SplitConfig.eta {eta_problem(self.eta)}; None: no "
                             "privatization")
        if not self.cti_multiplier >= 1.0:  # also rejects NaN
            raise ValueError(f"SplitConfig.cti_multiplier must be >= 1 (η on contributing "
                             f"tokens is multiplied by it; inf = no noise on them), got "
                             f"{self.cti_multiplier!r}")
        if not 0.0 < self.cti_coverage <= 1.0:
            raise ValueError(f"SplitConfig.cti_coverage must be in (0, 1], got "
                             f"{self.cti_coverage!r}")
        if not (math.isfinite(self.cti_smoothing) and self.cti_smoothing > 0):
            raise ValueError(f"SplitConfig.cti_smoothing must be a positive finite number (α "
                             f"of the add-α estimate), got {self.cti_smoothing!r}")
        if self.cti_rule not in CTI_RULES:
            raise ValueError(f"SplitConfig.cti_rule must be one of {', '.join(CTI_RULES)}, "
                             f"got {self.cti_rule!r}")
        if self.privatize not in PRIVATIZE_MODES:
            raise ValueError(f"SplitConfig.privatize must be one of {', '.join(PRIVATIZE_MODES)}"
                             f", got {self.privatize!r}")
        if self.privatize == "output" and self.split_layer < 1:
            raise ValueError("SplitConfig.privatize='output' needs split_layer >= 1: it noises "
                             "the output of the bottom's blocks (with the embedding layer alone "
                             "use privatize='tokens', SAP Algorithm 1)")
        if self.privatize == "output" and self.cti:
            raise ValueError("SplitConfig.cti needs privatize='tokens': CTI scales the noise of "
                             "chosen tokens (SAP §4.4), and output noise has no tokens")
        if self.label_dp_epsilon is not None:
            if not (math.isfinite(self.label_dp_epsilon) and self.label_dp_epsilon > 0):
                raise ValueError(f"SplitConfig.label_dp_epsilon must be a positive finite "
                                 f"number or None, got {self.label_dp_epsilon!r}")
            if self.cti:
                raise ValueError("SplitConfig.label_dp_epsilon with cti: the contributing "
                                 "tokens are computed from the true labels and shape the "
                                 "release, so the labels would not be ε-label-DP")
        if self.cti and self.eta is None:
            raise ValueError("SplitConfig.cti=True needs eta: CTI only decides which tokens get "
                             "less noise, and without privatization there is none")
        if self.method not in SPLIT_METHODS:
            hint = (" (prefix tuning would put key/value prefixes into the customer's blocks "
                    "too; use lora or prompt)" if self.method == "prefix" else "")
            raise ValueError(f"SplitConfig.method must be one of {', '.join(SPLIT_METHODS)}, "
                             f"got {self.method!r}{hint}")
        if self.pooling not in ("auto", "mean", "last"):
            raise ValueError(f"SplitConfig.pooling must be auto, mean or last, got "
                             f"{self.pooling!r}")
        if self.privatizer_mode not in ("exact", "fast", "annoy"):
            raise ValueError(f"SplitConfig.privatizer_mode must be exact, fast or annoy, got "
                             f"{self.privatizer_mode!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"SplitConfig.precision must be one of {', '.join(PRECISIONS)}, "
                             f"got {self.precision!r}")
        for name in ("lora_r", "lora_alpha", "num_virtual_tokens", "epochs", "batch_size",
                     "max_length"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SplitConfig.{name} must be an integer >= 1, got {v!r}")
        if self.max_length < 3:
            raise ValueError(f"SplitConfig.max_length must be >= 3 (room for the special "
                             f"tokens and one word), got {self.max_length}")
        for name in ("lr", "head_lr", "bottom_lr"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"SplitConfig.{name} must be a positive finite number, got "
                                 f"{v!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"SplitConfig.weight_decay must be >= 0, got {self.weight_decay!r}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"SplitConfig.warmup_ratio must be in [0, 1), got "
                             f"{self.warmup_ratio!r}")

    def check_layers(self, num_layers: int) -> None:
        """Refuse a split the backbone cannot make (the top needs at least one block)."""
        if self.split_layer > num_layers - 1:
            raise ValueError(f"SplitConfig.split_layer={self.split_layer} but the backbone has "
                             f"{num_layers} blocks: choose 0..{num_layers - 1} (the provider's "
                             "top keeps at least one block)")

    def to_dict(self) -> dict:
        d = asdict(self)
        if math.isinf(d["cti_multiplier"]):
            d["cti_multiplier"] = "inf"  # JSON has no infinity
        return d

    def provider_view(self) -> dict:
        """The fields of :data:`PROVIDER_FIELDS` (what a remote session is created with)."""
        return {k: getattr(self, k) for k in PROVIDER_FIELDS}

    @classmethod
    def from_dict(cls, d: dict) -> SplitConfig:
        d = known_fields(cls, d)
        if d.get("cti_multiplier") == "inf":
            d["cti_multiplier"] = math.inf
        return cls(**d)
