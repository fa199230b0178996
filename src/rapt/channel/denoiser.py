"""The contextual denoiser: p(original token | privatized row), learned from public text.

An encoder backbone reads a privatized row and predicts, at every position, the original token
through an MLM-style decoder tied to the backbone's input embeddings
(``logits = LayerNorm(gelu(dense(h))) @ Eᵀ + bias``) plus a learned "keep" bonus on the received
token, so that copying the input (what nearest neighbour does) is the starting point.

It is trained on (privatized -> original) pairs of *public* text, privatized by the provider
with the same mechanism, so it costs no privacy, and it sees only privatized ids at predict
time: what it outputs is post-processing of the dχ release. The same model is also an
attacker (where it beats the others we ran, its recovery sets the empirical privacy, an upper
bound) and the first utility remedy (denoise-then-tune: rows pass through
:meth:`Denoiser.denoise` before tuning and predict).

Training goes through :func:`rapt.training.loop.run_loop` with a
:class:`rapt.training.loop.MeanStep` over a :class:`DenoisingObjective`;
nothing here reads or writes files except
:meth:`Denoiser.save` / :meth:`Denoiser.load`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from rapt.artifacts import ArtifactError, Kind, save_artifact
from rapt.attacks.recovery import ReconstructionInput, register_attacker
from rapt.channel.corpus import check_aligned, encode_rows, special_wrap
from rapt.channel.model import ChannelModel
from rapt.training.loop import (
    MeanStep,
    ModelOutput,
    SummedLoss,
    TrainableTensors,
    run_adamw,
)

if TYPE_CHECKING:
    from rapt.models import Backbone

__all__ = ["Denoiser", "DenoiserConfig", "DenoisingObjective", "denoiser_attack",
           "fit_change_margin", "train_denoiser"]

FORMAT = "rapt-denoiser"
VERSION = 1
TENSORS_FILE = "denoiser.safetensors"
CONFIG_FILE = "config.json"
KIND = Kind(FORMAT, VERSION, TENSORS_FILE, "denoiser")

Rows = Sequence[Sequence[int]]


@dataclass
class DenoiserConfig:
    """``lr`` (AdamW, linear warm-up over ``warmup`` of the steps then decay), ``epochs``,
    ``batch_size`` (rows), ``max_length`` (tokens per encoded row, [CLS]/[SEP] included; longer
    rows keep their tail as received), ``trainable`` ("full": every weight, or "lora": rank
    ``lora_r`` adapters on the attention plus the decoder head), ``keep_bonus`` (initial logit
    bonus of the received token), ``seed`` (init, dropout, data order), ``change_margin``
    (logit units: :meth:`Denoiser.guess` replaces a received token only when the best other
    token beats it by more than this; 0 = plain argmax; :func:`fit_change_margin` picks it on
    held-out public pairs, so that an undertrained model does not break the tokens the mechanism
    left alone)."""

    lr: float = 5e-5
    epochs: int = 1
    batch_size: int = 32
    max_length: int = 64
    trainable: Literal["full", "lora"] = "full"
    keep_bonus: float = 4.0
    lora_r: int = 8
    warmup: float = 0.06
    weight_decay: float = 0.0
    seed: int = 0
    change_margin: float = 0.0

    def __post_init__(self) -> None:
        if self.trainable not in ("full", "lora"):
            raise ValueError(f"trainable must be 'full' or 'lora', got {self.trainable!r}")
        if self.max_length < 3:
            raise ValueError(f"max_length must be >= 3 (two special tokens and one token), "
                             f"got {self.max_length}")
        for name in ("lr", "epochs", "batch_size", "lora_r"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class Denoiser(nn.Module, ChannelModel):
    """Encoder + tied MLM-style decoder + keep bonus over one backbone (a private copy of its
    weights, so the caller's backbone is never changed).

    ``forward(ids (B, L), mask (B, L)) -> logits (B, L, V)`` over the backbone's vocabulary;
    ``guess`` / ``denoise`` take privatized rows only. ``meta`` records provenance (backbone,
    corpus, token count, η band). As a channel model it rewrites the rows
    (:meth:`prepare_rows`, denoise-then-tune) and the public backbone reads them; its guesses
    make it an attacker on the release too."""

    KIND = KIND
    config_class = DenoiserConfig
    remedy = "denoise-then-tune"
    attacker = "channel denoiser"

    def __init__(self, backbone: Backbone, config: DenoiserConfig,
                 meta: dict | None = None) -> None:
        super().__init__()
        if backbone.kind != "encoder":
            raise ValueError(f"the denoiser reads both sides of each token: it needs an encoder "
                             f"backbone, {backbone.name!r} is {backbone.kind}")
        self.config = config
        self.meta = dict(meta or {})
        self.tokenizer = backbone.tokenizer
        self.special_ids = backbone.special_ids
        torch.manual_seed(config.seed)
        encoder = copy.deepcopy(backbone.model)
        if config.trainable == "lora":  # on peft's attention targets for the family
            from rapt.tuning.tuners import add_lora

            encoder = add_lora(encoder, r=config.lora_r, alpha=2 * config.lora_r, wrap=True)
        else:
            for p in encoder.parameters():  # a tuner may have frozen the shared backbone
                p.requires_grad_(True)
        self.encoder = encoder
        emb = encoder.get_input_embeddings().weight  # (V, d), tied: trains with "full" only
        h, d = backbone.hidden_size, emb.shape[1]
        self.dense = nn.Linear(h, d)
        self.norm = nn.LayerNorm(d, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(emb.shape[0]))
        self.keep = nn.Parameter(torch.tensor(float(config.keep_bonus)))
        # Never output a special token for a real one.
        self.register_buffer("special_mask", torch.isin(
            torch.arange(emb.shape[0]), torch.tensor(self.special_ids, dtype=torch.long)),
            persistent=False)
        # The head is built on the CPU; the whole model lives where the backbone does (a GPU
        # backbone gets a GPU denoiser, also when rebuilt by :meth:`load`).
        self.to(emb.device)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """-> logits (B, L, V) of the original token at each position."""
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        z = self.norm(nn.functional.gelu(self.dense(h)))
        logits = z @ self.encoder.get_input_embeddings().weight.T + self.bias
        logits = logits.masked_fill(self.special_mask, float("-inf"))
        keep = torch.zeros_like(logits).scatter_(-1, input_ids.unsqueeze(-1), 1.0)
        return logits + self.keep * keep

    # ----------------------------------------------------------------------- encoding

    def _wrap(self) -> tuple[list[int], list[int]]:
        return special_wrap(self.tokenizer)

    def encode(self, rows: Rows) -> tuple[Tensor, Tensor, int]:
        """Rows -> (ids (N, L), mask (N, L), offset of the rows' first token): each row cut to
        what fits in ``max_length`` and wrapped in [CLS] ... [SEP] where the tokenizer has them."""
        return encode_rows(self.tokenizer, rows, self.config.max_length)

    # ----------------------------------------------------------------------- predict

    @torch.no_grad()
    def guess(self, private_rows: Rows, batch_size: int = 64) -> list[list[int]]:
        """Argmax original token for every position of each privatized row; special tokens, pad
        and positions beyond ``max_length`` are returned as received."""
        was = self.training
        self.eval()
        out = [[int(t) for t in r] for r in private_rows]
        special = set(self.special_ids)
        dev = self.bias.device
        head, tail = self._wrap()
        room = self.config.max_length - len(head) - len(tail)
        order = sorted(range(len(out)), key=lambda i: len(out[i]))
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            ids, mask, off = self.encode([out[i] for i in idx])
            ids = ids.to(dev)
            logits = self(ids, mask.to(dev))
            best, arg = logits.max(-1)
            recv = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
            pred = torch.where(best - recv > self.config.change_margin, arg, ids).cpu()
            for b, i in enumerate(idx):
                row = out[i]
                for j in range(min(len(row), room)):
                    if row[j] not in special:
                        row[j] = int(pred[b, off + j])
        self.train(was)
        return out

    def denoise(self, private_rows: Rows, batch_size: int = 64) -> list[list[int]]:
        """The remedy's view of :meth:`guess`: privatized rows -> denoised rows of the same
        lengths, to be tuned on and predicted from in place of the privatized ones."""
        return self.guess(private_rows, batch_size)

    def prepare_rows(self, texts: Rows) -> list[list[int]]:
        """The channel model's view of :meth:`denoise`."""
        return self.denoise(texts)

    def adapted_backbone(self, backbone: Backbone) -> Backbone:
        """Remedy (c), privatized-MLM adaptation in the manner of Qu et al. (CIKM 2021): a
        :class:`rapt.models.Backbone` whose encoder is this denoiser's (trained to read
        privatized text), for tuning and predicting on privatized rows as released.

        Only a ``"full"`` denoiser has adapted encoder weights. The returned backbone shares
        this denoiser's encoder (a tuner freezes it; the denoiser itself stays usable). The
        privatizer must keep using ``backbone``'s own embeddings: the mechanism is the
        customer's, run on the public backbone, whatever the provider does afterwards."""
        if self.config.trainable != "full":
            raise ValueError("adapted_backbone needs a denoiser trained with trainable='full' "
                             f"(this one is {self.config.trainable!r}: its encoder is the "
                             "backbone's own)")
        if self.encoder.config.hidden_size != backbone.hidden_size:
            raise ValueError(f"this denoiser was trained on another backbone than "
                             f"{backbone.name!r}")
        return replace(backbone, name=f"{backbone.name}+privatized-MLM", model=self.encoder,
                       extra={**backbone.extra, "channel_adapted": True})

    # ----------------------------------------------------------------------- artifact

    def trained_tensors(self) -> dict[str, Tensor]:
        """What is saved: every trainable tensor (all weights for "full", the adapters and the
        decoder head for "lora")."""
        return {n: p.detach() for n, p in self.named_parameters() if p.requires_grad}

    def save(self, folder: str | Path) -> Path:
        """``denoiser.safetensors`` + ``config.json`` (format, config, meta); -> the folder."""
        return save_artifact(folder, self.trained_tensors(), asdict(self.config), self.meta,
                             kind=KIND)

    @classmethod
    def _rebuild(cls, folder: Path, config: DenoiserConfig, state: dict[str, Tensor],
                 meta: dict, backbone: Backbone) -> Denoiser:
        """The denoiser saved in ``folder`` (through :meth:`ChannelModel.load`), rebuilt on
        ``backbone``; raises :class:`rapt.artifacts.ArtifactError` naming the file."""
        model = cls(backbone, config, meta)
        try:
            TrainableTensors(model).load_state_dict(state)
        except (ValueError, RuntimeError) as e:
            raise ArtifactError(f"{folder / TENSORS_FILE}: {e}") from e
        return model.eval()


# --------------------------------------------------------------------------- training


@dataclass
class _Pairs:
    """Encoded training pairs: privatized ids and mask (N, L), targets (N, L) with -100 where
    nothing is predicted, replaced (N, L)."""

    ids: Tensor
    mask: Tensor
    targets: Tensor
    replaced: Tensor
    n_tokens: int = field(default=0)


def _pairs(model: Denoiser, clean_rows: Rows, private_rows: Rows) -> _Pairs:
    check_aligned(clean_rows, private_rows)
    ids, mask, _ = model.encode(private_rows)
    tgt, _, _ = model.encode(clean_rows)
    special = torch.tensor(model.special_ids, dtype=torch.long)
    predicted = mask.bool() & ~torch.isin(tgt, special)
    targets = tgt.masked_fill(~predicted, -100)
    return _Pairs(ids, mask, targets, predicted & (ids != tgt), int(predicted.sum()))


@dataclass
class DenoisingObjective:
    """Cross-entropy of the original token at each position, given the privatized row (the
    contextual denoiser); ``out.logits`` is (B, L, V).

    ``targets`` (N, L): original ids, -100 where nothing is predicted (special tokens, pad);
    ``replaced`` (N, L): positions the mechanism changed. Per example: the mean CE over its
    predicted positions. Stats are per token (1-D, so a logical batch averages over tokens):
    ``token_acc`` over every predicted position, ``replaced_acc`` over the replaced ones."""

    targets: Tensor
    replaced: Tensor
    weight: float = 1.0

    def __call__(self, out: ModelOutput, idx: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        L = out.logits.shape[1]  # batches are padded to their own longest row
        tgt = self.targets[idx][:, :L].to(out.logits.device)
        rep = self.replaced[idx][:, :L].to(out.logits.device)
        ce = nn.functional.cross_entropy(out.logits.float().transpose(1, 2), tgt,
                                         ignore_index=-100, reduction="none")  # (B, L)
        valid = tgt != -100
        loss = ce.sum(1) / valid.sum(1).clamp(min=1)
        right = (out.logits.argmax(-1) == tgt).float().detach()
        return loss, {"token_acc": right[valid], "replaced_acc": right[valid & rep]}


def train_denoiser(backbone: Backbone, clean_rows: Rows, private_rows: Rows,
                   config: DenoiserConfig | None = None, *,
                   meta: dict | None = None,
                   progress: Callable[[dict], None] | None = None,
                   should_stop: Callable[[], bool] | None = None,
                   init: Denoiser | None = None) -> Denoiser:
    """Train a :class:`Denoiser` on aligned (original, privatized) token-id rows of public text
    (no special tokens needed: rows are wrapped in [CLS] ... [SEP] here).

    ``meta``: provenance recorded with the model (corpus, η or η band, ...); the backbone, the
    row and token counts and the training history's last record are added. ``progress`` gets
    :func:`rapt.training.loop.run_loop`'s records (loss, token_acc, replaced_acc, ...).
    ``init``: a denoiser to train in place (a saved checkpoint loaded on the same backbone, or
    a new one the caller holds a handle to, with the same ``trainable``) under ``config``'s
    optimizer settings and a fresh learning-rate schedule; its earlier runs' steps and token
    counts stay in ``meta["earlier"]``."""
    config = config or DenoiserConfig()
    if init is None:
        model = Denoiser(backbone, config, meta)
    else:
        if init.config.trainable != config.trainable:
            raise ValueError(f"init was trained with trainable={init.config.trainable!r}; it "
                             f"cannot go on as {config.trainable!r}")
        earlier = list(init.meta.get("earlier", []))
        if init.meta.get("steps") is not None:  # a model built but never trained has none
            earlier.append({k: init.meta.get(k) for k in ("rows", "tokens", "steps", "stopped")})
        model, model.config = init, config
        model.meta = {**init.meta, **(meta or {}), "earlier": earlier}
    data = _pairs(model, clean_rows, private_rows)
    dev = next(iter(backbone.model.parameters())).device
    model.to(dev).train()

    def forward(idx: Tensor) -> ModelOutput:
        n = int(data.mask[idx].sum(1).max())  # pad each batch to its own longest row
        logits = model(data.ids[idx, :n].to(dev), data.mask[idx, :n].to(dev))
        return ModelOutput(logits, None, logits)

    loss = SummedLoss(forward, [DenoisingObjective(data.targets, data.replaced)])
    # Rows of similar length share a pass: the same batches and mean gradient, less padding
    # (the decoder's (B, L, V) logits dominate a step).
    step = MeanStep(loss, len(clean_rows), config.batch_size, config.epochs, config.seed,
                    lengths=data.mask.sum(1).tolist())
    state = run_adamw(step, model, "denoiser", config.trainable, len(clean_rows), lr=config.lr,
                      weight_decay=config.weight_decay, warmup=config.warmup,
                      progress=progress, should_stop=should_stop)
    model.eval()
    model.meta.update({"backbone": backbone.name, "hidden_size": backbone.hidden_size,
                       "rows": len(clean_rows), "tokens": data.n_tokens,
                       "replaced": int(data.replaced.sum()), "steps": state.step,
                       "stopped": state.stopped,
                       "last": state.history[-1] if state.history else None})
    return model


@torch.no_grad()
def fit_change_margin(model: Denoiser, clean_rows: Rows, private_rows: Rows,
                      grid: Sequence[float] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0),
                      ) -> dict[float, float]:
    """Set ``model.config.change_margin`` to the value of ``grid`` with the best token recovery
    on held-out *public* (clean, privatized) pairs; -> recovery per margin. Only public text is
    read, so this costs no privacy."""
    saved = model.config.change_margin
    scores: dict[float, float] = {}
    try:
        for m in grid:
            model.config.change_margin = float(m)
            guess = model.guess(private_rows)
            ok = n = 0
            for c, g in zip(clean_rows, guess, strict=True):
                n += len(c)
                ok += sum(int(a == b) for a, b in zip(c, g, strict=True))
            scores[float(m)] = ok / max(1, n)
    finally:
        model.config.change_margin = saved
    if scores:
        model.config.change_margin = max(scores, key=lambda m: (scores[m], m))
    return scores


# --------------------------------------------------------------------------- attacker

_OPTION_TYPES = {"lr": float, "epochs": int, "batch_size": int, "max_length": int,
                 "trainable": str, "keep_bonus": float, "lora_r": int, "seed": int,
                 "change_margin": float}


def denoiser_attack(inp: ReconstructionInput) -> list[list[int]]:
    """Registry entry ``"denoiser"``. ``options["denoiser"]``: a trained :class:`Denoiser` or
    the folder of a saved one (loaded on ``inp.backbone``); without it, one is trained here on
    ``inp.public_rows`` privatized at ``inp.eta`` (seeded by ``inp.seed``), its
    :class:`DenoiserConfig` fields taken from ``options["denoiser_<field>"]``."""
    if inp.backbone is None:
        raise ValueError("the denoiser attacker needs the backbone (its encoder reads the rows)")
    den: Any = inp.options.get("denoiser")
    if isinstance(den, str | Path):
        den = Denoiser.load(den, inp.backbone)
    if den is None:
        if not inp.public_rows:
            raise ValueError("the denoiser attacker needs a trained denoiser "
                             "(option denoiser=FOLDER) or public_rows to train one on")
        from rapt.privacy.mechanism import Privatizer

        cfg = DenoiserConfig(**{k: t(inp.options[f"denoiser_{k}"])
                                for k, t in _OPTION_TYPES.items()
                                if f"denoiser_{k}" in inp.options})
        priv = Privatizer(inp.embeddings, inp.eta, special_ids=inp.special_ids,
                          candidate_ids=inp.candidate_ids, index=inp.index, seed=inp.seed)
        public = [list(r) for r in inp.public_rows if len(r)]
        flat = priv.privatize_ids(torch.tensor([t for r in public for t in r])).cpu()
        noised = [x.tolist() for x in torch.split(flat, [len(r) for r in public])]
        den = train_denoiser(inp.backbone, public, noised, cfg,
                             meta={"corpus": "public_rows", "eta": inp.eta})
    return den.guess(inp.private_rows)


register_attacker("denoiser", denoiser_attack)
