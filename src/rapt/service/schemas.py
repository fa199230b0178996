"""Request and response bodies of the service API, with validated ranges."""

from __future__ import annotations

import unicodedata
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from rapt.config import (
    ETA_MAX,
    ETA_MIN,
    LR_HELP,
    PRECISION_HELP,
    VIRTUAL_TOKENS_HELP,
    default_lr,
    default_method,
    default_virtual_tokens,
)
from rapt.config import tune_default as _d
from rapt.guarantee import EPSILON_MAX

TokenIds = list[list[int]]
# Integer bounds at the door: a value the code behind cannot hold (torch seeds are 64-bit, the
# customer's data order multiplies its seed by ~1e6; SQLite integers are 64-bit) must be a 422,
# never a stored row that fails later. The service's Limits are usually tighter.
MAX_SEED = 2**31 - 1
MAX_ROWS = 1 << 30


def _valid_unicode(text: str) -> str:
    """JSON may carry lone UTF-16 surrogates (``"\\ud800"``), which no tokenizer, database or
    response can encode: refuse them by name."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"contains a lone UTF-16 surrogate (U+{ord(text[e.start]):04X}) at "
                         f"character {e.start}; send valid Unicode text") from None
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]


def _blank(text: str) -> bool:
    """Nothing a tokenizer keeps: only whitespace, control and format characters (NUL, the
    zero-width space...), which tokenizers drop, so the row would arrive empty."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf") for ch in text)

# Every request body: unknown fields refused, no type coercion, floats finite (JSON's
# Infinity, NaN and 1e999 would otherwise pass range checks such as eta > 0).
REQUEST = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ErrorBody(BaseModel):
    """Every error response: a short machine-readable code and a human-readable detail."""

    error: str
    detail: str


class ClassEtas(BaseModel):
    """η of each class of token (null: released in clear)."""

    model_config = REQUEST

    personal: float | None = Field(ge=0, le=ETA_MAX, description="personal-data spans (0: each "
                                   "token swapped for a random one before the noise)")
    rare: float | None = Field(ge=ETA_MIN, le=ETA_MAX, description="words outside the "
                               "frequent_rank most frequent of rapt's public word list")
    frequent: float | None = Field(ge=ETA_MIN, le=ETA_MAX, description="the other words")


class KindDeclaration(BaseModel):
    """Noise by kind of token (rapt.privacy.by_kind): the policy and each class's η, never a
    statistic of the rows."""

    model_config = REQUEST

    protect: Literal["all", "rare", "personal"] = Field(
        description="the classes that got the declaration's eta: all | rare (personal and "
        "rare) | personal")
    frequent_rank: Literal[100, 1000, 10000] = Field(
        description="rare: outside this many most frequent words of rapt's public word list")
    class_eta: ClassEtas
    eta_personal: float | None = Field(
        None, ge=0, le=ETA_MAX, description="personal data's own η, at most eta (0: its release "
        "does not depend on it); null: personal data gets its class's η")
    personal_rank: Literal[1000, 10000] | None = Field(
        None, description="words outside this many most frequent public words got personal "
        "data's η (as if the detector had found them), at least frequent_rank; null: none did")


class PrivacyDeclaration(BaseModel):
    """What the client declares it did to the data before sending it (not verifiable here)."""

    model_config = REQUEST

    mechanism: Literal["dchi-text2text", "none"] = Field(
        description="'dchi-text2text' (Feyisetan et al. 2020, RAPT §3.1) or 'none' "
        "(the user explicitly opted out of privatization)")
    eta: float | None = Field(None, ge=ETA_MIN, le=ETA_MAX,
                              description="privacy parameter η (smaller = more noise)")
    embedding: Text | None = Field(None, max_length=200,
                                   description="embedding model the mechanism used")
    nn_mode: Text | None = Field(None, max_length=20, description="nearest-neighbour search mode")
    by_kind: KindDeclaration | None = Field(
        None, description="noise by kind of token: eta is the protected classes'; null: "
        "every token at eta")

    @model_validator(mode="after")
    def _eta_iff_mechanism(self) -> PrivacyDeclaration:
        if self.mechanism == "dchi-text2text" and self.eta is None:
            raise ValueError("mechanism 'dchi-text2text' needs eta")
        if self.mechanism == "none" and self.eta is not None:
            raise ValueError("mechanism 'none' takes no eta")
        if self.by_kind is not None:
            self._check_by_kind(self.by_kind)
        return self

    def _check_by_kind(self, kinds: KindDeclaration) -> None:
        """The protected classes got eta; the others one η of their own, not below eta (the
        mechanism never noises frequent words more than rare ones), or none (in clear)."""
        from rapt.privacy.by_kind import CLASSES, KindPolicy

        if self.eta is None:
            raise ValueError("by_kind needs mechanism 'dchi-text2text' and its eta")
        policy = KindPolicy(kinds.protect, kinds.frequent_rank,
                            personal_rank=kinds.personal_rank)  # ValueError naming the field
        etas = kinds.class_eta
        if kinds.eta_personal is not None:
            if kinds.eta_personal > self.eta:
                raise ValueError(f"by_kind.eta_personal = {kinds.eta_personal:g} is above eta "
                                 f"({self.eta:g}): personal data gets at least eta's noise")
            if etas.personal != kinds.eta_personal:
                raise ValueError("by_kind.class_eta.personal must be by_kind.eta_personal "
                                 f"({kinds.eta_personal:g})")
        others = set()
        for i, name in enumerate(CLASSES):
            got = getattr(etas, name)
            if name == "personal" and kinds.eta_personal is not None:
                continue
            if policy.protected(i) and got != self.eta:
                raise ValueError(f"by_kind.class_eta.{name} must be eta ({self.eta:g}): "
                                 f"protect '{kinds.protect}' protects the {name} class")
            if not policy.protected(i):
                if got is not None and got < self.eta:
                    raise ValueError(f"by_kind.class_eta.{name} = {got:g} is below eta "
                                     f"({self.eta:g})")
                others.add(got)
        if len(others) > 1:
            raise ValueError("by_kind.class_eta: the unprotected classes share one η (or are "
                             "all in clear)")


class DatasetUpload(BaseModel):
    """A privatized training set: token ids (specials included) or privatized texts (the
    service tokenizes them), and integer labels."""

    model_config = REQUEST

    backbone: Text = Field(max_length=500, description="name of a backbone this server loaded")
    input_ids: TokenIds | None = Field(None, min_length=1)
    texts: list[Text] | None = Field(None, min_length=1,
                                     description="privatized texts, instead of input_ids")
    text_pairs: list[Text] | None = Field(
        None, min_length=1, description="privatized second texts of sentence pairs, one per "
        "text (encoded as the backbone's tokenizer pairs two texts; one that only concatenates "
        "them gets the two joined by a newline)")
    labels: list[int] = Field(min_length=1)
    num_labels: int = Field(ge=2, le=1000)
    privacy: PrivacyDeclaration
    plain_ids: list[int] | None = Field(
        None, max_length=512,
        description="public plain tokens k for privatized token reconstruction (RAPT §3.2.2); "
        "each row of input_ids then holds their privatized version after the leading specials")

    @model_validator(mode="after")
    def _consistent(self) -> DatasetUpload:
        rows = _one_of(self.input_ids, self.texts, self.text_pairs)
        if self.texts is not None and self.plain_ids is not None:
            raise ValueError("plain_ids need input_ids (the plain tokens' positions are only "
                             "defined for token id rows)")
        if len(self.labels) != rows:
            raise ValueError(f"labels has {len(self.labels)} entries but there are {rows} rows")
        for i, y in enumerate(self.labels):
            if not 0 <= y < self.num_labels:
                raise ValueError(f"labels[{i}] = {y} is outside [0, num_labels={self.num_labels})")
        return self


def _one_of(input_ids: TokenIds | None, texts: list[str] | None,
            text_pairs: list[str] | None = None) -> int:
    """Exactly one of input_ids / texts, no empty row, text_pairs only with as many texts;
    returns the number of rows."""
    if (input_ids is None) == (texts is None):
        raise ValueError("give exactly one of input_ids and texts")
    if text_pairs is not None:
        if texts is None:
            raise ValueError("text_pairs need texts (token id rows hold both texts already)")
        if len(text_pairs) != len(texts):
            raise ValueError(f"text_pairs has {len(text_pairs)} entries but texts has "
                             f"{len(texts)}")
        for i, t in enumerate(text_pairs):
            if _blank(t):
                raise ValueError(f"text_pairs[{i}] is empty (only whitespace or control "
                                 "characters)")
    if input_ids is not None:
        for i, row in enumerate(input_ids):
            if not row:
                raise ValueError(f"input_ids[{i}] is empty")
        return len(input_ids)
    for i, t in enumerate(texts):
        if _blank(t):
            raise ValueError(f"texts[{i}] is empty (only whitespace or control characters)")
    return len(texts)


class DatasetInfo(BaseModel):
    id: str
    backbone: str
    n_examples: int
    num_labels: int
    max_row_len: int
    privacy: PrivacyDeclaration
    plain_ids: list[int] | None
    created: float


class ChannelInfo(BaseModel):
    """The provider's channel model (issue 27, denoise-then-tune): built by the provider from
    public text it privatized itself (`rapt adapt`); it reads the uploaded privatized rows back
    before tuning and predict. Post-processing of the release (the dχ guarantee at η is
    unchanged), and also an attacker at that η: its recovery counts in the empirical privacy
    (1 − the best recovery of the attackers we ran, an upper bound)."""

    fingerprint: str = Field(description="sha256 of the channel model's config and tensors")
    provenance: dict = Field(description="backbone, public corpus (sources, token count), η "
                             "band, measured P and held-out recovery, as `rapt adapt` recorded")
    note: str = Field(description="what reading the rows back does to empirical privacy")


_CHANNEL_FIELD = ("the provider's channel model the rows are read back through before tuning "
                  "and predict (denoise-then-tune); null: none, the rows are used as uploaded")


class DPOptions(BaseModel):
    """PromptDPSGD options (rapt.dp.DPConfig); give target_epsilon or noise_multiplier."""

    model_config = REQUEST

    target_epsilon: float | None = Field(
        None, gt=0, le=EPSILON_MAX, description=f"at most ε_max = {EPSILON_MAX:g}: above it a "
        "DP guarantee promises nothing (docs/THREAT_MODEL.md)")
    noise_multiplier: float | None = Field(
        None, gt=0, le=100, description="σ; refused (422, with the smallest σ accepted) when "
        f"its ε over the job's steps is above ε_max = {EPSILON_MAX:g}")
    max_grad_norm: float = Field(1.0, gt=0, le=1000)
    delta: float | None = Field(None, gt=0, lt=1, description="must be below 1/N (N: the "
                                "dataset's rows); default min(1e-5, 1/(10·N))")
    sample_rate: float | None = Field(None, gt=0, le=1)
    physical_batch_size: int | None = Field(None, ge=1, le=4096)
    accountant: Literal["rdp", "prv"] = "rdp"

    @field_validator("noise_multiplier", mode="before")
    @classmethod
    def _some_noise(cls, v: object) -> object:
        # Before the range check, so that 0 gets a message saying why, not just "> 0".
        if isinstance(v, int | float) and not isinstance(v, bool) and v == 0:
            raise ValueError("0 adds no noise: clipping alone gives no privacy guarantee "
                             "(ε = ∞); give noise_multiplier > 0 or target_epsilon, or leave "
                             "dp out to train without DP")
        return v

    @model_validator(mode="after")
    def _one_of(self) -> DPOptions:
        if (self.target_epsilon is None) == (self.noise_multiplier is None):
            raise ValueError("give exactly one of target_epsilon and noise_multiplier")
        return self


class JobCreate(BaseModel):
    """A tuning job over an uploaded dataset; ranges are what the service accepts. Defaults
    are ``rapt.config.TuneConfig``'s (the same as `rapt tune` and `rapt client tune`); lr and
    num_virtual_tokens left out take the method's default."""

    model_config = REQUEST

    dataset_id: Text = Field(max_length=64)
    method: Literal["prompt", "prefix", "lora"] | None = Field(
        None, description="default: LoRA, or prefix with dp (rapt.config.default_method)")
    reconstruction: bool = _d("reconstruction")
    num_virtual_tokens: int | None = Field(
        None, ge=1, le=512, description=VIRTUAL_TOKENS_HELP)
    prefix_projection: bool = _d("prefix_projection")
    lr: float | None = Field(None, gt=0, le=1.0,
                             description=LR_HELP)
    epochs: int = Field(_d("epochs"), ge=1, le=100)
    batch_size: int = Field(_d("batch_size"), ge=1, le=1024)
    max_length: int = Field(_d("max_length"), ge=4, le=4096)
    seed: int = Field(_d("seed"), ge=0, le=MAX_SEED)
    rec_hidden: int = Field(_d("rec_hidden"), ge=1, le=4096)
    rec_vocab_size: int = Field(_d("rec_vocab_size"), ge=2, le=1_000_000)
    rec_weight: float = Field(_d("rec_weight"), ge=0, le=100)
    rec_reduction: Literal["mean", "sum"] = _d("rec_reduction")
    # Task head (rapt.tuning.heads). Label descriptions are public task metadata ("a positive
    # review"), not the user's data; "auto" picks the label-description head when given them.
    head: Literal["auto", "linear", "label-description"] = _d("head")
    label_descriptions: list[Annotated[Text, Field(min_length=1, max_length=200)]] | None = \
        Field(None, min_length=2, max_length=1000)
    head_temperature: float = Field(_d("head_temperature"), gt=0, le=10)
    precision: Literal["auto", "fp32", "bf16"] = Field(_d("precision"),
                                                       description=PRECISION_HELP)
    dp: DPOptions | None = None
    use_channel: bool | None = Field(
        None, description="read the privatized rows back through the provider's channel "
        "model for the dataset's backbone before tuning (and the queries at predict). Default "
        "(null): yes when the server holds one and the dataset was privatized; true: the same, "
        "but refuse the job (422) when it cannot; false: tune on the rows as uploaded")
    output_denoiser: bool = Field(False, description=(
        "after tuning, the job fits a user-side output denoiser (Split-N-Denoise) for the "
        "prompt on public text (the provider's cost: its tuned prompt's states on public "
        "sentences, clean and privatized at the dataset's η; no row of the dataset); its "
        "owner downloads it with GET /v1/prompts/{id}/output-denoiser and corrects the pooled "
        "states of privatized queries on its own machine. Needs a privatized dataset and an "
        "encoder head (linear or label-description)"))

    @model_validator(mode="after")
    def _method_defaults(self) -> JobCreate:
        # Resolved here so that the stored job records the values it really trains with.
        if self.method is None:
            self.method = default_method(self.dp is not None)
        if self.lr is None:
            self.lr = default_lr(self.method)
        if self.num_virtual_tokens is None:
            self.num_virtual_tokens = default_virtual_tokens(self.method)
        return self


JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class JobStage(BaseModel):
    """A stage of a job after its training steps (step and total_steps count those)."""

    name: Literal["output_denoiser"] = Field(description="output_denoiser: fitting the "
                                             "prompt's output denoiser on public text")
    done: int = Field(description="units of the stage done (rows read in chunks, epochs)")
    total: int
    started: float = Field(description="when the stage began (Unix time)")


class JobStatus(BaseModel):
    id: str
    dataset_id: str
    backbone: str
    state: JobState
    method: str
    step: int
    total_steps: int | None
    loss: float | None
    epoch: float | None = Field(description="epochs completed so far, fractional (1.0 when a "
                                "one-epoch job is done)")
    epsilon: float | None = Field(None, description="DP ε spent so far (DP jobs), at `delta`")
    delta: float | None = Field(None, description="the δ of the job's (ε, δ) guarantee (DP "
                                "jobs): dp.delta, or min(1e-5, 1/(10·N)) for N rows")
    elapsed_s: float
    eta_s: float | None = Field(description="estimated seconds left (from steps done so far)")
    resumed_from_step: int | None
    prompt_id: str | None
    error: str | None
    created: float
    channel: ChannelInfo | None = Field(None, description=_CHANNEL_FIELD)
    stage: JobStage | None = Field(None, description="the stage after training that the job "
                                   "is in or last reached (output_denoiser); null: none")


class DPGuarantee(BaseModel):
    """The (ε, δ)-DP guarantee of a prompt tuned with PromptDPSGD, as its job accounted it."""

    epsilon: float = Field(description="ε spent over `steps` steps, at `delta`")
    delta: float
    noise_multiplier: float = Field(description="σ, in units of max_grad_norm")
    max_grad_norm: float
    sample_rate: float = Field(description="Poisson sampling rate q")
    steps: int
    accountant: str
    seeded: bool = Field(description="true: the noise came from a seed, which voids the "
                         "guarantee for whoever knows it")


class PromptInfo(BaseModel):
    id: str
    job_id: str
    backbone: str
    num_labels: int
    method: str
    reconstruction: bool
    plain_ids: list[int] | None
    privacy: PrivacyDeclaration | None = Field(
        None, description="what the training data's uploader declared (η, embedding, search "
        "mode): clients privatize queries with the same η by default; None for prompts from "
        "before it was recorded")
    created: float
    channel: ChannelInfo | None = Field(None, description=_CHANNEL_FIELD + "; predict refuses "
                                        "(409) when the server no longer holds it")
    head: str | None = Field(None, description="the task head the job trained (linear, "
                             "label-description, verbalizer)")
    training_warnings: list[str] | None = Field(
        None, description="after tuning, the job predicted (up to 1,000 of) its training rows: "
        "why the predictions look collapsed (near-constant, or no better than the majority "
        "class), labels by id; [] when they do not; None for prompts from before this check")
    dp: DPGuarantee | None = Field(None, description="the (ε, δ)-DP guarantee of a prompt tuned "
                                   "with dp; null: tuned without DP")
    output_denoiser: bool = Field(False, description="its job fitted an output denoiser "
                                  "(GET /v1/prompts/{id}/output-denoiser)")


class DenoiserHead(BaseModel):
    """The prompt's task head as the user side runs it on a corrected pooled state."""

    kind: Literal["linear", "label-description"]
    num_labels: int
    temperature: float | None = Field(None, description="label-description: logits are "
                                      "cos(state, label embedding) / temperature")


class OutputDenoiserInfo(BaseModel):
    """What the prompt's owner needs to correct the pooled states of its privatized queries
    on its own machine (``rapt.local.denoise``): the output denoiser the job fitted on public
    text, and the prompt's task head, which reads the corrected state."""

    prompt_id: str
    denoiser: dict = Field(description="the denoiser's document: hidden and width, the "
                           "fingerprint of the prompt it was fitted for, and its fit record "
                           "(public corpus, η, rows, held-out error before and after)")
    head: DenoiserHead
    tensors: str = Field(description="base64 of a safetensors file: 'denoiser.<name>' (the "
                         "denoiser's state) and 'head.<name>' (linear: linear.weight and "
                         "linear.bias; label-description: label_embeddings)")
    sha256: str = Field(description="sha256 of the decoded tensors file")


class PredictRequest(BaseModel):
    """Privatized queries for one tuned prompt: token ids (specials included, laid out as the
    training rows) or privatized texts."""

    model_config = REQUEST

    prompt_id: Text = Field(max_length=64)
    input_ids: TokenIds | None = Field(None, min_length=1)
    texts: list[Text] | None = Field(None, min_length=1)
    text_pairs: list[Text] | None = Field(None, min_length=1,
                                          description="second texts of sentence pairs")
    return_pooled: bool = Field(False, description=(
        "also return the tuned prompt's pooled states of these rows (what its head reads), "
        "for a user-side output denoiser (rapt.local.denoise); encoder heads only"))

    @model_validator(mode="after")
    def _rows(self) -> PredictRequest:
        _one_of(self.input_ids, self.texts, self.text_pairs)
        return self


class PredictResponse(BaseModel):
    prompt_id: str
    labels: list[int]
    probabilities: list[list[float]]
    channel: ChannelInfo | None = Field(None, description="the channel model the queries were "
                                        "read back through (the prompt's); null: none")
    pooled: list[list[float]] | None = Field(None, description=(
        "with return_pooled: one state (hidden size floats) per row, the prompt's pooled state "
        "of the row as sent, which its head reads; null otherwise"))


class BackboneInfo(BaseModel):
    name: str
    kind: str
    vocab_size: int
    hidden_size: int
    special_ids: list[int]
    channel: ChannelInfo | None = Field(None, description="the channel model jobs on this "
                                        "backbone use by default; null: none loaded")


class SapSessionCreate(BaseModel):
    """A SAP split-training session: the provider's part of ``rapt.split.SplitConfig``
    (``PROVIDER_FIELDS``) and the number of training rows. There is no label field, no class
    count and no η: the output layer and the labels stay with the customer."""

    model_config = REQUEST

    backbone: Text = Field(max_length=500, description="name of a backbone this server loaded")
    n_examples: int = Field(ge=1, le=MAX_ROWS,
                            description="training rows (sets total steps with epochs and "
                                        "batch_size; a frozen bottom uploads this many)")
    split_layer: int = Field(0, ge=0, le=1024, description="blocks the customer runs after "
                                                           "the embedding layer")
    unfreeze_bottom: bool = False
    method: Literal["lora", "prompt"] = "lora"
    lora_r: int = Field(8, ge=1, le=256)
    lora_alpha: int = Field(16, ge=1, le=4096)
    num_virtual_tokens: int = Field(10, ge=1, le=512)
    pooling: Literal["auto", "mean", "last"] = "auto"
    lr: float = Field(1e-3, gt=0, le=10)
    weight_decay: float = Field(0.0, ge=0, le=10)
    warmup_ratio: float = Field(0.06, ge=0, lt=1)
    epochs: int = Field(3, ge=1, le=10_000)
    batch_size: int = Field(32, ge=1, le=MAX_ROWS)
    max_length: int = Field(64, ge=3, le=1 << 16)
    seed: int = Field(0, ge=0, le=MAX_SEED,
                      description="top init and data order (never privacy noise)")
    precision: Literal["auto", "fp32", "bf16"] = Field("fp32", description=PRECISION_HELP)


class SapSessionInfo(BaseModel):
    """A session's state; ``last_step`` is the last applied step (-1: none yet), the next
    training step is ``last_step + 1``."""

    id: str
    backbone: str
    config: dict
    split_layer: int
    method: str
    unfreeze_bottom: bool
    n_examples: int
    total_steps: int
    last_step: int
    steps_done: int
    rows_received: int
    created: float
