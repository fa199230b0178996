"""The one trainer: prompt / prefix / LoRA / full tuning, optional RAPT reconstruction, optional DP.

``tune(backbone, input_ids, labels, num_labels, config)`` trains on token-id rows that the user
already privatized (see :mod:`rapt.tuning.reconstruction` for the row layout with plain tokens) and
returns a :class:`TunedPrompt`: the trained prompt/prefix (or LoRA / full weights) plus the task
head, without the reconstruction head. Loss per example: CE(task) + ``rec_weight`` · L_rec
(RAPT eq. 10). Without DP the batch loss is the mean; with ``config.dp`` it is the PromptDPSGD
loop of :class:`rapt.dp.DPSGD` (Poisson logical batches, physical micro-batches, per-example
clipping through the broadcast protocol). The loop itself, the two gradient steps, the summed
objectives and the checked resume state live in :mod:`rapt.training.loop`; this module builds them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from rapt import __version__
from rapt.config import (  # noqa: F401  (TuneConfig re-exported; defaults live there)
    DP_DEFAULT_METHOD,
    DP_METHODS,
    HEADS,
    TuneConfig,
)
from rapt.models import Backbone
from rapt.noise import NoiseSource
from rapt.precision import autocast, device_of, resolve_precision
from rapt.training.loop import (
    DPStep,
    GradientStep,
    MeanStep,
    ModelOutput,
    Plan,
    SummedLoss,
    TaskCE,
    TrainableTensors,
    TrainState,
    run_loop,
    upgrade_checkpoint,
    warmup_linear,
)
from rapt.tuning.heads import (
    ClassificationHead,
    LabelDescriptionHead,
    Verbalizer,
    encode_descriptions,
    label_token_ids,
    pool,
)
from rapt.tuning.reconstruction import (
    Reconstruction,
    ReconstructionHead,
    _as_sequences,
    build_rows,
    plain_offset,
    privatize_rows,
    public_rec_vocabulary,
    rec_vocabulary,
)
from rapt.tuning.tuners import Tuner, build_tuner


def resolve_head(kind: str, config: TuneConfig) -> str:
    """The head ``config`` builds on a backbone of ``kind``: ``head`` unless it is "auto"."""
    if config.head != "auto":
        return config.head
    if kind == "causal" and config.label_words:
        return "verbalizer"
    if config.label_descriptions:
        return "label-description"
    return "linear"


# --------------------------------------------------------------------------- model


class RaptModel(nn.Module):
    """tuner + task head (+ reconstruction head while training).

    Deliberately has no ``per_example_tensors`` of its own: the DP engine finds the tuner's
    among ``modules()``, and a second copy would count the prompt gradient twice.
    """

    def __init__(self, backbone: Backbone, config: TuneConfig, num_labels: int,
                 rec_vocab: Sequence[int] | None = None, plain_len: int = 0,
                 offset: int = 0) -> None:
        super().__init__()
        self.kind = backbone.kind
        self.precision = config.precision
        self.tuner: Tuner = build_tuner(backbone, config.method,
                                        num_virtual_tokens=config.num_virtual_tokens,
                                        prefix_projection=config.prefix_projection,
                                        lora_r=config.lora_r, seed=config.seed)
        torch.manual_seed(config.seed)
        self.head_kind, self.head = make_head(backbone, config, num_labels, self.tuner.model)
        # What is saved: the tuner's and the head's trainable parameters plus the head's
        # persistent buffers (the label-description embeddings), fixed before freeze_prompt.
        self._saved = {n for n, p in self.named_parameters() if p.requires_grad}
        self._saved |= {f"head.{k}" for k in self.head.state_dict()}
        if config.freeze_prompt:
            for p in self.tuner.parameters():
                p.requires_grad_(False)
        self.plain_len = plain_len
        self.offset = offset
        self.rec_head: ReconstructionHead | None = None
        if rec_vocab is not None:
            self.rec_head = ReconstructionHead(backbone.hidden_size, config.rec_hidden,
                                               len(rec_vocab))

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                with_rec: bool = True) -> tuple[Tensor, Tensor | None, Tensor]:
        """-> (task logits (B, C), reconstruction logits (B, m, |T|) or None, hidden (B, n, h)).
        Only the tuner's backbone pass runs at ``precision``; its states come back as float32,
        so the heads (and everything after them: losses, DP clipping) stay fp32."""
        with autocast(self.precision, input_ids.device):
            hidden = self.tuner(input_ids, attention_mask)
        hidden = hidden.float()
        logits = self.head(hidden, task_mask(attention_mask, self.plain_len, self.offset))
        rec = None
        if with_rec and self.rec_head is not None and self.plain_len:
            rec = self.rec_head(hidden[:, self.offset:self.offset + self.plain_len])
        return logits, rec, hidden

    def trainable_tensors(self) -> dict[str, Tensor]:
        """Everything that is saved: the tuner's and the task head's trainable parameters (also
        when ``freeze_prompt`` kept them at init) and the head's buffers (label embeddings);
        never the reconstruction head."""
        return {n: t for n, t in self.state_dict(keep_vars=True).items() if n in self._saved}


def make_head(backbone: Backbone, config: TuneConfig, num_labels: int,
              lm_model: nn.Module) -> tuple[str, nn.Module]:
    """(head kind, task head) of ``config``; a verbalizer borrows ``lm_model``'s LM head."""
    kind = resolve_head(backbone.kind, config)
    pooling = config.pooling if backbone.kind == "encoder" else "last"
    if kind == "verbalizer":
        if backbone.kind != "causal":
            raise ValueError("head='verbalizer' needs a causal LM (it scores label words with "
                             "the LM head); encoders such as minilm ship none: use "
                             "head='label-description'")
        if len(config.label_words) != num_labels:
            raise ValueError(f"{len(config.label_words)} label words for {num_labels} labels")
        return kind, Verbalizer(lm_model.get_output_embeddings(),
                                label_token_ids(backbone.tokenizer, config.label_words))
    if kind == "label-description":
        if len(config.label_descriptions) != num_labels:
            raise ValueError(f"{len(config.label_descriptions)} label descriptions for "
                             f"{num_labels} labels")
        # Encoded by the shared backbone without the prompt (for LoRA/full: before training).
        emb = encode_descriptions(backbone, config.label_descriptions, pooling)
        return kind, LabelDescriptionHead(emb, pooling, config.head_temperature)
    return kind, ClassificationHead(backbone.hidden_size, num_labels, pooling)


def task_mask(attention_mask: Tensor, plain_len: int, offset: int) -> Tensor:
    """(B, n) mask of the positions the task head reads: the input without the plain tokens
    (RAPT's G_{m:m+n}) at ``offset .. offset + plain_len``."""
    if not plain_len:
        return attention_mask
    mask = attention_mask.clone()
    mask[:, offset:offset + plain_len] = 0
    return mask


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int,
              device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Right-pad rows -> (ids (B, n), attention mask (B, n))."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids.to(device), mask.to(device)


# --------------------------------------------------------------------------- result


@dataclass
class TunedPrompt:
    """A trained prompt/prefix (+ task head). ``meta`` records backbone, plain tokens and their
    offset, label names, η (set by whoever privatized), seed and DP record; the per-step
    training history too, except under DP, where it is computed on private batches outside the
    guarantee and stays in ``train_log`` (local only, never saved with the artifact)."""

    config: TuneConfig
    tensors: dict[str, Tensor]
    meta: dict = field(default_factory=dict)
    train_log: list[dict] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._cache: tuple[int, RaptModel] | None = None
        self._head_cache: tuple[int, nn.Module] | None = None

    @property
    def plain_ids(self) -> list[int] | list[list[int]] | None:
        return self.meta.get("plain_ids")

    def _check_backbone(self, backbone: Backbone) -> None:
        if backbone.hidden_size != self.meta.get("hidden_size", backbone.hidden_size):
            raise ValueError(f"this prompt was tuned on {self.meta.get('backbone')!r} (hidden "
                             f"size {self.meta['hidden_size']}), not on {backbone.name!r} "
                             f"(hidden size {backbone.hidden_size})")

    def build(self, backbone: Backbone) -> RaptModel:
        """The inference model on ``backbone`` (cached per backbone model object)."""
        if self._cache is not None and self._cache[0] == id(backbone.model):
            return self._cache[1]
        self._check_backbone(backbone)
        model = RaptModel(backbone, self.config, int(self.meta["num_labels"]),
                          plain_len=int(self.meta.get("plain_len", 0)),
                          offset=int(self.meta.get("plain_offset", 0)))
        missing, unexpected = model.load_state_dict(self.tensors, strict=False)
        expected = set(model.trainable_tensors())
        if unexpected or expected & set(missing):
            raise ValueError(f"tensors do not fit the {self.config.method} model: missing "
                             f"{sorted(expected & set(missing))}, unexpected {sorted(unexpected)}")
        model.to(next(iter(backbone.model.parameters())).device)
        model.eval()
        self._cache = (id(backbone.model), model)
        return model

    def build_head(self, backbone: Backbone) -> nn.Module:
        """The task head alone, for passes that apply the tuned weights themselves (the
        service's mixed LoRA pass): no tuner, so no private copy of the backbone for LoRA.
        Cached per backbone model object like ``build``."""
        if self._head_cache is not None and self._head_cache[0] == id(backbone.model):
            return self._head_cache[1]
        self._check_backbone(backbone)
        with torch.random.fork_rng(devices=[]):  # the linear head's init is overwritten below
            _, head = make_head(backbone, self.config, int(self.meta["num_labels"]),
                                backbone.model)
        state = {k[len("head."):]: v for k, v in self.tensors.items() if k.startswith("head.")}
        head.load_state_dict(state, strict=True)
        head.to(next(iter(backbone.model.parameters())).device).eval()
        self._head_cache = (id(backbone.model), head)
        return head

    @torch.no_grad()
    def predict_proba(self, backbone: Backbone, input_ids: Sequence[Sequence[int]],
                      batch_size: int = 64) -> Tensor:
        """Class probabilities (N, C) for privatized rows laid out as in training."""
        def proba(m: RaptModel, ids: Tensor, mask: Tensor) -> Tensor:
            return m(ids, mask, with_rec=False)[0].float().softmax(-1)

        return self._by_length(backbone, input_ids, batch_size, int(self.meta["num_labels"]),
                               proba)

    def _by_length(self, backbone: Backbone, input_ids: Sequence[Sequence[int]],
                   batch_size: int, width: int, fn) -> Tensor:
        """(N, width) float32: ``fn(model, ids, mask)`` on batches of rows of similar length
        (less padding), put back in the rows' order."""
        model = self.build(backbone)
        pad = backbone.tokenizer.pad_token_id
        order = sorted(range(len(input_ids)), key=lambda i: len(input_ids[i]))
        out = torch.empty(len(input_ids), width)
        dev = next(iter(backbone.model.parameters())).device
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            ids, mask = pad_batch([input_ids[i] for i in idx], pad, dev)
            out[idx] = fn(model, ids, mask).float().cpu()
        return out

    @torch.no_grad()
    def pooled(self, backbone: Backbone, input_ids: Sequence[Sequence[int]],
               batch_size: int = 64) -> Tensor:
        """(N, h) float32: the states the task head reads, after its pooling, for rows laid out
        as in training (what the service returns to a user-side output denoiser). Encoder
        heads only (linear, label-description)."""
        model = self.build(backbone)
        if not hasattr(model.head, "from_pooled"):
            raise ValueError(f"the {model.head_kind} head reads no pooled state")

        def pooled(m: RaptModel, ids: Tensor, mask: Tensor) -> Tensor:
            hidden = m(ids, mask, with_rec=False)[2]
            return pool(hidden, task_mask(mask, m.plain_len, m.offset), m.head.pooling)

        return self._by_length(backbone, input_ids, batch_size, backbone.hidden_size, pooled)

    @torch.no_grad()
    def head_proba(self, backbone: Backbone, pooled: Tensor) -> Tensor:
        """Class probabilities (N, C) of the task head on (N, h) pooled states."""
        head = self.build(backbone).head
        dev = next(iter(backbone.model.parameters())).device
        return head.from_pooled(pooled.to(dev)).float().softmax(-1).cpu()

    def predict(self, backbone: Backbone, input_ids: Sequence[Sequence[int]],
                batch_size: int = 64) -> list[int]:
        return self.predict_proba(backbone, input_ids, batch_size).argmax(-1).tolist()

    def encode(self, backbone: Backbone, texts: Sequence[str], privatizer=None,
               noise: NoiseSource | None = None, *,
               text_pairs: Sequence[str | None] | None = None) -> list[list[int]]:
        """User side: texts (or sentence pairs with ``text_pairs``) -> rows in this prompt's
        layout (plain tokens included when it was trained with them), privatized when a
        privatizer is given."""
        plain = self.plain_ids
        seqs = _as_sequences(plain)
        index = [0] * len(texts) if len(seqs) > 1 else None
        rows = build_rows(backbone.tokenizer, texts, self.config.max_length, plain, index,
                          text_pairs=text_pairs)
        return privatize_rows(rows, privatizer, noise) if privatizer is not None else rows

    def save(self, folder: str | Path) -> Path:
        from rapt.artifacts import save_artifact

        return save_artifact(folder, self.tensors, self.config.to_dict(), self.meta)

    @classmethod
    def load(cls, folder: str | Path) -> TunedPrompt:
        from rapt.artifacts import ArtifactError, load_artifact

        tensors, config, meta = load_artifact(folder)
        try:
            cfg = TuneConfig.from_dict(config)
        except (TypeError, ValueError) as e:
            raise ArtifactError(f"{Path(folder) / 'config.json'}: field 'config': {e}") from e
        if "num_labels" not in meta:
            raise ArtifactError(f"{Path(folder) / 'config.json'}: field 'meta.num_labels' missing")
        return cls(cfg, tensors, meta)


# --------------------------------------------------------------------------- training


def _check_inputs(input_ids, labels, num_labels: int) -> None:
    if len(input_ids) == 0:
        raise ValueError("no training examples (input_ids is empty)")
    if len(input_ids) != len(labels):
        raise ValueError(f"{len(input_ids)} rows but {len(labels)} labels")
    if num_labels < 2:
        raise ValueError(f"num_labels must be >= 2 (got {num_labels})")
    for i, y in enumerate(labels):
        if not 0 <= int(y) < num_labels:
            raise ValueError(f"label of example {i} is {y}, outside 0..{num_labels - 1}")
    for i, r in enumerate(input_ids):
        if len(r) == 0:
            raise ValueError(f"row {i} is empty")


def tune(
    backbone: Backbone,
    input_ids: list[list[int]],
    labels: list[int],
    num_labels: int,
    config: TuneConfig,
    *,
    plain_ids: list[int] | list[list[int]] | None = None,
    plain_index: list[int] | None = None,
    progress: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    checkpoint: Callable[[dict], None] | None = None,
    resume: dict | None = None,
) -> TunedPrompt:
    """Train and return a :class:`TunedPrompt`.

    ``input_ids``: rows already privatized by the user. When ``plain_ids`` (the public plain
    tokens k, length m; or several sequences with ``plain_index[i]`` naming row i's) are given,
    every row holds its privatized k at positions ``plain_offset(tokenizer) .. +m``.
    ``progress`` gets ``{"step", "total_steps", "epoch", "loss", "task_loss", "rec_loss",
    "rec_acc", "lr", "epsilon"?}`` after every optimizer step; ``should_stop()`` is polled every
    step (a stopped run returns what it has, ``meta["stopped"] = True``); ``checkpoint(state)``
    gets a resumable state (:meth:`rapt.training.loop.TrainState.state_dict`, plain tensors and
    numbers) every ``config.checkpoint_every`` steps (or each epoch end), which ``resume=state``
    continues exactly; a state of another method, N or DP setting is refused (ValueError), and
    the flat states of rapt before it still resume.
    """
    _check_inputs(input_ids, labels, num_labels)
    seqs = _as_sequences(plain_ids)
    if config.reconstruction and not seqs:
        raise ValueError("reconstruction=True needs plain_ids (the plain tokens k)")
    if len(seqs) > 1 and (plain_index is None or len(plain_index) != len(input_ids)):
        raise ValueError("several plain-token sequences need plain_index, one entry per row")
    m = len(seqs[0]) if seqs else 0
    off = plain_offset(backbone.tokenizer) if m else 0
    for i, r in enumerate(input_ids):
        if len(r) < off + m:
            raise ValueError(f"row {i} has {len(r)} tokens, fewer than the {off} + {m} leading "
                             "special + plain tokens")
    if config.dp is not None and config.method not in DP_METHODS:
        raise ValueError("PromptDPSGD covers prompt and prefix tuning only "
                         f"(method={config.method!r}); leave the method out to get "
                         f"{DP_DEFAULT_METHOD!r}")
    dev = next(iter(backbone.model.parameters())).device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return _tune(backbone, input_ids, labels, num_labels, config, seqs, plain_index, m, off,
                     dev, progress, should_stop, checkpoint, resume)


def _tune(backbone, input_ids, labels, num_labels, config: TuneConfig, seqs, plain_index, m,
          off, dev, progress, should_stop, checkpoint, resume) -> TunedPrompt:
    """build -> :func:`rapt.training.loop.run_loop` -> :func:`_result`."""
    saved = upgrade_checkpoint(resume) if resume is not None else None
    rec_vocab = _rec_vocab(backbone, input_ids, config, seqs, saved)
    model = RaptModel(backbone, config, num_labels, rec_vocab, m, off).to(dev)
    state = TrainState("tune", config.method, len(input_ids), {}, meta={"rec_vocab": rec_vocab})
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:  # freeze_prompt with a frozen head: nothing trains, the prompt stays at init
        return _result(backbone, config, model, num_labels, seqs, m, off, state, None, 0, 0.0)
    loss_fn = _loss_fn(model, backbone, input_ids, labels, config, seqs, rec_vocab, plain_index,
                       dev)
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    step = _gradient_step(model, config, loss_fn, [len(r) for r in input_ids])
    total = step.plan.total_steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_linear(total, int(config.warmup_ratio * total)))
    state.components = {"model": TrainableTensors(model), "optimizer": opt, "scheduler": sched,
                        **step.components()}
    on_checkpoint = None
    if checkpoint is not None:
        def on_checkpoint(s: TrainState) -> None:
            checkpoint(s.state_dict())
    t0 = time.perf_counter()
    try:
        if saved is not None:
            state.load_state_dict(saved)
        model.train()
        model.tuner.model.eval()  # backbone dropout off: deterministic, and the shared model's
        # mode is left as it was found (LoRA/full train a private copy, also without dropout)
        run_loop(step, opt, sched, state, progress=progress, should_stop=should_stop,
                 checkpoint=on_checkpoint, checkpoint_every=config.checkpoint_every)
    finally:
        step.close()
        model.tuner.track_per_example = False
    return _result(backbone, config, model, num_labels, seqs, m, off, state, step, total,
                   time.perf_counter() - t0)


def _rec_vocab(backbone, input_ids, config: TuneConfig, seqs, saved: dict | None
               ) -> list[int] | None:
    """The reconstruction vocabulary T (None: no reconstruction head): the resumed run's, else
    public under DP (T from the rows would leak them), else the rows' most frequent tokens."""
    if saved is not None and saved["meta"].get("rec_vocab") is not None:
        return list(saved["meta"]["rec_vocab"])
    if not config.reconstruction or config.freeze_prompt:
        return None  # L_rec acts only through the prompt: with it frozen there is no rec head
    if config.dp is not None:
        return public_rec_vocabulary(backbone.tokenizer, seqs, config.rec_vocab_size)
    return rec_vocabulary(input_ids, seqs, config.rec_vocab_size, set(backbone.special_ids))


def _loss_fn(model: RaptModel, backbone, input_ids, labels, config: TuneConfig, seqs,
             rec_vocab, plain_index, dev) -> SummedLoss:
    """Per-example CE(task) + ``rec_weight`` · L_rec over padded batches of ``input_ids``."""
    pad = backbone.tokenizer.pad_token_id

    def forward(idx: Tensor) -> ModelOutput:
        ids, mask = pad_batch([input_ids[i] for i in idx.tolist()], pad, dev)
        return ModelOutput(*model(ids, mask))

    objectives: list = [TaskCE(torch.as_tensor(labels, dtype=torch.long))]
    if rec_vocab is not None:
        index = {t: j for j, t in enumerate(rec_vocab)}
        targets = torch.tensor([[index[t] for t in s] for s in seqs], dtype=torch.long)
        which = plain_index if plain_index is not None else [0] * len(input_ids)
        objectives.append(Reconstruction(targets, torch.as_tensor(which, dtype=torch.long),
                                         config.rec_weight, config.rec_reduction))
    return SummedLoss(forward, objectives)


def planned_steps(config: TuneConfig, n_examples: int) -> int:
    """Optimizer steps a run over ``n_examples`` rows takes (DP: Poisson steps for ``epochs``
    expected passes at rate q; else batches per epoch times epochs). ValueError, naming the
    field, for a DP batch larger than the dataset."""
    if config.dp is None:
        return Plan.of_batches(n_examples, config.batch_size, config.epochs).total_steps
    from rapt.dp.accounting import steps_for_epochs

    if config.dp.sample_rate is None and config.batch_size > n_examples:
        raise ValueError(
            f"batch_size={config.batch_size} is larger than the dataset ({n_examples} rows): "
            f"DP samples each row with q = batch_size / N, which must be at most 1; use "
            f"batch_size <= {n_examples} or set dp.sample_rate")
    q = config.dp.resolve_sample_rate(n_examples, config.batch_size)
    return steps_for_epochs(config.epochs, q)


def _gradient_step(model: RaptModel, config: TuneConfig, loss_fn: SummedLoss,
                   lengths: Sequence[int]) -> GradientStep:
    """:class:`DPStep` over a :class:`rapt.dp.DPSGD` when ``config.dp`` is set, else
    :class:`MeanStep` (its batches run in passes of similar ``lengths``, rows' tokens)."""
    n = len(lengths)
    if config.dp is None:
        return MeanStep(loss_fn, n, config.batch_size, config.epochs, config.seed,
                        lengths=lengths)
    try:
        from rapt.dp import DPSGD
    except ImportError as e:  # pragma: no cover - the DP module ships with rapt
        raise RuntimeError(f"config.dp is set but rapt.dp is unavailable ({e})") from e
    model.tuner.track_per_example = True
    engine = DPSGD(model, config.dp, n, planned_steps(config, n),
                   batch_size=config.batch_size, seed=config.dp.noise_seed)
    return DPStep(loss_fn, engine, config.epochs)


def _result(backbone, config: TuneConfig, model: RaptModel, num_labels, seqs, m, off,
            state: TrainState, step: GradientStep | None, total: int,
            seconds: float) -> TunedPrompt:
    model.eval()
    rec_vocab = state.meta.get("rec_vocab")
    guarantee = step.record() if step is not None else None
    meta = {
        "rapt_version": __version__,
        "backbone": backbone.name,
        "backbone_kind": backbone.kind,
        "hidden_size": backbone.hidden_size,
        "num_labels": num_labels,
        "method": config.method,
        "head": model.head_kind,
        "freeze_prompt": config.freeze_prompt,
        "seed": config.seed,
        "plain_ids": (seqs[0] if len(seqs) == 1 else seqs) if seqs else None,
        "plain_len": m,
        "plain_offset": off,
        "rec_vocab_size": len(rec_vocab) if rec_vocab is not None else None,
        "n_examples": state.n_examples,
        "steps": state.step,
        "total_steps": total,
        "stopped": state.stopped,
        "train_seconds": round(seconds, 3),
        # what "auto" became on this machine (predict decides again on its own)
        "precision": resolve_precision(config.precision, device_of(backbone.model)),
        "dp": guarantee,
    }
    if guarantee is None:  # under a guarantee the history (private batches) stays local
        meta["history"] = state.history
    tensors = {k: v.detach().cpu().clone() for k, v in model.trainable_tensors().items()}
    result = TunedPrompt(config, tensors, meta, train_log=state.history)
    model.rec_head = None  # discarded after training (RAPT §3.2.2)
    result._cache = (id(backbone.model), model)
    return result
