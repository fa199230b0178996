"""The channel adapter: LoRA that makes a backbone read privatized text as it reads clean text,
learned from public text by distillation (the other channel remedy, the denoiser, rewrites the
rows instead).

A frozen teacher (the public backbone) reads clean public rows; a student (a private copy of
the backbone with peft LoRA on its attention and feed-forward projections) reads the same rows
privatized by the provider with the same mechanism, and learns to match the teacher's last
hidden states at the text positions, plus (``pooled_weight``) the mean-pooled sentence vector.
dχ privatization is token for token, so the positions of the two rows align.

The training pairs are public text (:func:`rapt.channel.corpus.public_corpus_for`), so training
costs no privacy; the adapted backbone (:meth:`ChannelAdapter.adapted_backbone`: the LoRA merged
into a plain copy) only ever reads the rows the customer released, so whatever is tuned or predicted
on it is post-processing of the dχ output. The customer's task prompt is then tuned on top of it,
the privatizer staying the public backbone's (the mechanism is the customer's).

Training goes through :func:`rapt.training.loop.run_loop` with a
:class:`rapt.training.loop.MeanStep` over a :class:`HiddenDistillation`;
nothing here reads or writes files except
:meth:`ChannelAdapter.save` / :meth:`ChannelAdapter.load`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from rapt.artifacts import ArtifactError, Kind, save_artifact
from rapt.channel.corpus import check_aligned, encode_rows
from rapt.channel.model import ChannelModel
from rapt.training.loop import (
    MeanStep,
    ModelOutput,
    SummedLoss,
    TrainableTensors,
    run_adamw,
)
from rapt.tuning.tuners import add_lora, base_model, copy_without_hooks

if TYPE_CHECKING:
    from rapt.models import Backbone

__all__ = ["ChannelAdapter", "ChannelAdapterConfig", "HiddenDistillation", "distillation_loss",
           "train_channel_adapter"]

FORMAT = "rapt-channel-adapter"
VERSION = 1
TENSORS_FILE = "channel_adapter.safetensors"
CONFIG_FILE = "config.json"
KIND = Kind(FORMAT, VERSION, TENSORS_FILE, "channel-adapter")
SUFFIX = "+channel-adapter"

Rows = Sequence[Sequence[int]]

# Attention and feed-forward projections per architecture family ("dense" in BERT is the
# attention output, the intermediate and the output projection of every block).
_ENCODER_TARGETS = ("query", "key", "value", "dense")
_DECODER_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class ChannelAdapterConfig:
    """``lora_r`` / ``lora_alpha`` (peft's scaling alpha / r), ``target_modules`` (module name
    suffixes; None: attention and feed-forward projections of the architecture), ``layers``
    (block indices; None: every block), ``lr`` (AdamW, linear warm-up over ``warmup`` of the
    steps then decay to 0), ``epochs``, ``batch_size`` (rows), ``max_length`` (tokens per
    encoded row, [CLS]/[SEP] included; longer rows are cut), ``pooled_weight`` (weight of the
    mean-pooled vector's MSE beside the per-token MSE; 0: off), ``seed`` (init, data order)."""

    lora_r: int = 16
    lora_alpha: int = 32
    target_modules: tuple[str, ...] | None = None
    layers: tuple[int, ...] | None = None
    lr: float = 1e-3
    epochs: int = 1
    batch_size: int = 32
    max_length: int = 64
    pooled_weight: float = 1.0
    warmup: float = 0.06
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        # JSON gives lists back; tuples keep configs comparable and hashable.
        if self.target_modules is not None:
            self.target_modules = tuple(str(t) for t in self.target_modules)
        if self.layers is not None:
            self.layers = tuple(int(i) for i in self.layers)
        for name in ("lora_r", "epochs", "batch_size", "max_length"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_length < 3:
            raise ValueError(f"max_length must leave room for a token, got {self.max_length}")
        if self.lr <= 0 or self.pooled_weight < 0:
            raise ValueError(f"need lr > 0 and pooled_weight >= 0, got {self.lr}, "
                             f"{self.pooled_weight}")


def _lora_copy(backbone: Backbone, config: ChannelAdapterConfig) -> nn.Module:
    """A private copy of ``backbone.model`` with fresh LoRA (B = 0: it starts as the backbone);
    only the LoRA tensors train. -> the peft model."""
    torch.manual_seed(config.seed)
    inner = copy_without_hooks(backbone.model)
    targets = config.target_modules or (
        _ENCODER_TARGETS if backbone.kind == "encoder" else _DECODER_TARGETS)
    n_layers = int(backbone.model.config.num_hidden_layers)
    layers = list(config.layers) if config.layers is not None else list(range(n_layers))
    if not layers or any(not 0 <= i < n_layers for i in layers):
        raise ValueError(f"layers {layers} outside the backbone's 0..{n_layers - 1}")
    return add_lora(inner, r=config.lora_r, alpha=config.lora_alpha, targets=targets,
                    layers=layers, wrap=True)


@dataclass
class _Pairs:
    """Encoded aligned rows: clean and private ids, mask (N, L); ``text`` (N, L): the text
    positions (no special token, no pad)."""

    clean: Tensor
    private: Tensor
    mask: Tensor
    text: Tensor


def _pairs(backbone: Backbone, clean_rows: Rows, private_rows: Rows, max_length: int) -> _Pairs:
    check_aligned(clean_rows, private_rows)
    clean, mask, _ = encode_rows(backbone.tokenizer, clean_rows, max_length)
    private, _, _ = encode_rows(backbone.tokenizer, private_rows, max_length)
    special = torch.tensor(backbone.special_ids, dtype=torch.long)
    return _Pairs(clean, private, mask, mask.bool() & ~torch.isin(clean, special))


@dataclass
class HiddenDistillation:
    """Mean squared error between the student's hidden states ``out.hidden`` (B, L, h) and a
    frozen teacher's (the channel adapter: the student reads
    privatized rows, the teacher the aligned clean ones).

    ``teacher(idx)`` -> (B, L, h) teacher states, computed without gradient; ``positions``
    (N, L): the token positions matched; ``pooled`` (N, L): the positions mean-pooled for the
    sentence-vector term, weighted ``pooled_weight`` (0: off). Per example: the mean over its
    matched positions of the per-dimension MSE, plus the weighted MSE of the pooled vectors.
    Stats per example: ``hidden_mse``, ``pooled_mse``, ``pooled_cos``."""

    teacher: Callable[[Tensor], Tensor]
    positions: Tensor
    pooled: Tensor
    pooled_weight: float = 0.0
    weight: float = 1.0

    def __call__(self, out: ModelOutput, idx: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        s = out.hidden.float()
        L = s.shape[1]  # batches are padded to their own longest row
        with torch.no_grad():
            t = self.teacher(idx).float()
        if t.shape != s.shape:
            raise ValueError(f"teacher states {tuple(t.shape)} do not match the student's "
                             f"{tuple(s.shape)}")
        pos = self.positions[idx][:, :L].to(s.device).float()
        tok = ((s - t) ** 2).mean(-1)  # (B, L)
        hidden = (tok * pos).sum(1) / pos.sum(1).clamp(min=1)
        pm = self.pooled[idx][:, :L].to(s.device).float().unsqueeze(-1)
        ps = (s * pm).sum(1) / pm.sum(1).clamp(min=1)
        pt = (t * pm).sum(1) / pm.sum(1).clamp(min=1)
        pooled = ((ps - pt) ** 2).mean(-1)
        loss = hidden + self.pooled_weight * pooled if self.pooled_weight else hidden
        cos = nn.functional.cosine_similarity(ps, pt, dim=-1)
        return loss, {"hidden_mse": hidden.detach(), "pooled_mse": pooled.detach(),
                      "pooled_cos": cos.detach()}


def _distillation(student: nn.Module, teacher: nn.Module, data: _Pairs,
                  pooled_weight: float) -> SummedLoss:
    """Example indices -> the student's loss on the private rows against the teacher on the
    clean ones. The pooled vector is the mean over every attended position ([CLS] and [SEP]
    too), the pooling that MiniLM was trained with and rapt's linear head uses."""
    dev = next(iter(student.parameters())).device

    def states(body: nn.Module, ids: Tensor, idx: Tensor) -> Tensor:
        n = int(data.mask[idx].sum(1).max())  # pad each batch to its own longest row
        return body(input_ids=ids[idx, :n].to(dev), attention_mask=data.mask[idx, :n].to(dev),
                    use_cache=False).last_hidden_state

    def forward(idx: Tensor) -> ModelOutput:
        h = states(student, data.private, idx)
        return ModelOutput(h, None, h)

    obj = HiddenDistillation(lambda idx: states(teacher, data.clean, idx), data.text,
                             data.mask.bool(), pooled_weight)
    return SummedLoss(forward, [obj])


class ChannelAdapter(ChannelModel):
    """A trained channel adapter: its config, LoRA tensors (peft names) and provenance ``meta``
    (corpus, tokens, η, backbone, training record). Holds no training rows.

    As a channel model it changes the model that reads the rows, not the rows: tuning and
    predict run on :meth:`reader` (:meth:`adapted_backbone`), the rows go in as released. It
    outputs no tokens, so it is no attacker of its own."""

    KIND = KIND
    config_class = ChannelAdapterConfig
    remedy = "channel adapter"

    def __init__(self, config: ChannelAdapterConfig, tensors: dict[str, Tensor],
                 meta: dict | None = None) -> None:
        self.config = config
        self.tensors = {k: v.detach().cpu() for k, v in tensors.items()}
        self.meta = dict(meta or {})
        # id(backbone.model) -> its adapted Backbone: merging copies the whole model, so a
        # customization's tune and predict (and a server's requests) share one copy.
        self._adapted: dict[int, Backbone] = {}

    def trained_tensors(self) -> dict[str, Tensor]:
        """The LoRA tensors (what is saved and fingerprinted)."""
        return self.tensors

    def _student(self, backbone: Backbone) -> nn.Module:
        """The peft model on a private copy of ``backbone`` with these tensors loaded; raises
        ValueError (RuntimeError for shapes) when they do not fit it."""
        if self.meta.get("hidden_size", backbone.hidden_size) != backbone.hidden_size:
            raise ValueError(f"this channel adapter was trained on {self.meta.get('backbone')!r}"
                             f", not on {backbone.name!r}")
        model = _lora_copy(backbone, self.config)
        TrainableTensors(model).load_state_dict(self.tensors)
        return model

    def adapted_backbone(self, backbone: Backbone) -> Backbone:
        """A :class:`rapt.models.Backbone` named ``"<name>+channel-adapter"`` whose
        model is a private copy of ``backbone``'s with this LoRA merged in, so tuners see a plain
        model. ``backbone`` is not modified. The privatizer must keep using ``backbone``'s own
        embeddings (the same, as the adapter leaves the embedding layer alone). Built once per
        backbone model and cached."""
        key = id(backbone.model)
        if key not in self._adapted:
            self._adapted[key] = self._merged(backbone)
        return self._adapted[key]

    def reader(self, backbone: Backbone) -> Backbone:
        """The channel model's view of :meth:`adapted_backbone`."""
        return self.adapted_backbone(backbone)

    def _merged(self, backbone: Backbone) -> Backbone:
        merged = self._student(backbone).merge_and_unload()
        for p in merged.parameters():  # as load_backbone gives it: tuners freeze what they keep
            p.requires_grad_(True)
        merged.eval()
        return replace(backbone, name=f"{backbone.name}{SUFFIX}", model=merged,
                       extra={**backbone.extra, "channel_adapted": True,
                              "channel_adapter": {k: self.meta.get(k)
                                                  for k in ("backbone", "eta", "corpus")}})

    # ----------------------------------------------------------------------- artifact

    def save(self, folder: str | Path) -> Path:
        """``channel_adapter.safetensors`` + ``config.json`` (format, config, meta); -> folder."""
        return save_artifact(folder, self.tensors, asdict(self.config), self.meta, kind=KIND)

    @classmethod
    def _rebuild(cls, folder: Path, config: ChannelAdapterConfig, state: dict[str, Tensor],
                 meta: dict, backbone: Backbone) -> ChannelAdapter:
        """The adapter saved in ``folder`` (through :meth:`ChannelModel.load`), its tensors
        checked on ``backbone``; raises :class:`rapt.artifacts.ArtifactError` naming the file."""
        adapter = cls(config, state, meta)
        try:
            adapter._student(backbone)
        except (ValueError, RuntimeError) as e:
            raise ArtifactError(f"{folder / TENSORS_FILE}: {e}") from e
        return adapter


def train_channel_adapter(backbone: Backbone, clean_rows: Rows, private_rows: Rows,
                          config: ChannelAdapterConfig | None = None, *,
                          meta: dict | None = None,
                          progress: Callable[[dict], None] | None = None,
                          should_stop: Callable[[], bool] | None = None) -> ChannelAdapter:
    """Train a :class:`ChannelAdapter` on aligned (original, privatized) token-id rows of
    public text (text only: rows are wrapped in [CLS] ... [SEP] here). ``backbone`` is the
    frozen teacher, read under no_grad and never modified.

    ``meta``: provenance (corpus, η, ...); the backbone, row and token counts and the last
    training record are added. ``progress`` gets :func:`rapt.training.loop.run_loop`'s records
    (loss, hidden_mse, pooled_mse, pooled_cos, ...)."""
    config = config or ChannelAdapterConfig()
    data = _pairs(backbone, clean_rows, private_rows, config.max_length)
    student = _lora_copy(backbone, config)
    # No dropout: the teacher is deterministic, and a student with dropout would chase it
    # through noise of its own.
    student.eval()
    loss = _distillation(base_model(student.get_base_model()), base_model(backbone.model),
                         data, config.pooled_weight)
    step = MeanStep(loss, len(clean_rows), config.batch_size, config.epochs, config.seed)
    state = run_adamw(step, student, "channel-adapter", "lora", len(clean_rows), lr=config.lr,
                      weight_decay=config.weight_decay, warmup=config.warmup,
                      progress=progress, should_stop=should_stop)
    record = {**(meta or {}), "backbone": backbone.name, "hidden_size": backbone.hidden_size,
              "rows": len(clean_rows), "tokens": int(data.text.sum()), "steps": state.step,
              "stopped": state.stopped,
              "last": state.history[-1] if state.history else None}
    return ChannelAdapter(config, TrainableTensors(student).state_dict(), record)


@torch.no_grad()
def distillation_loss(backbone: Backbone, reader: Backbone, clean_rows: Rows,
                      private_rows: Rows, *, max_length: int = 64, pooled_weight: float = 1.0,
                      batch_size: int = 64) -> dict[str, float]:
    """How far ``reader``'s states on the privatized rows are from ``backbone``'s on the clean
    ones, with the training objective: the mean over rows of ``loss``, ``hidden_mse``,
    ``pooled_mse`` and ``pooled_cos`` (cosine of the mean-pooled vectors). ``reader`` is the
    backbone itself (no remedy) or an adapted one."""
    data = _pairs(backbone, clean_rows, private_rows, max_length)
    fn = _distillation(base_model(reader.model), base_model(backbone.model), data,
                       pooled_weight)
    order = torch.argsort(data.mask.sum(1))  # similar lengths batch together: less padding
    sums: dict[str, float] = {}
    for idx in order.split(batch_size):
        loss, stats = fn(idx)
        for k, v in {"loss": loss, **stats}.items():
            sums[k] = sums.get(k, 0.0) + float(v.sum())
    return {k: v / len(clean_rows) for k, v in sums.items()} | {"rows": len(clean_rows)}
