"""The LLM reconstruction attacker, fine-tuned: LoRA on (privatized, original) pairs of public text.

The few-shot attacker (:mod:`rapt.attacks.llm_recovery`) shows a causal LLM a handful of public
sentences privatized at the target's η. Here the LLM instead learns the channel from many such
pairs: each pair is written exactly as the attacker prompts a target (:func:`build_prompt` with
no examples), followed by the original sentence and EOS, and the loss is the cross-entropy of
that answer only (:class:`AnswerCE`; the prompt is read, never predicted). Only LoRA tensors
train (:func:`rapt.tuning.tuners.add_lora`, on a private copy of the LLM), through the project's
one training loop (:func:`rapt.training.loop.run_adamw` with a :class:`MeanStep`).

Training reads public text only, privatized by the provider's own mechanism, so it costs no
privacy. The result, a :class:`TunedLLM`, is saved as ``adapter.safetensors`` + ``config.json``
with its provenance (base LLM, η or η band, corpus, steps) and handed to the attacker through
its ``llm_adapter`` option (a folder or a :class:`TunedLLM`); with an adapter the attacker's
prompt has no examples, and its reply filter is the adapter's ``max_change`` when one was
picked on held-out public rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from rapt.artifacts import ArtifactError, Kind, load_artifact, save_artifact
from rapt.attacks.llm_prompt import build_prompt
from rapt.training.loop import (
    MeanStep,
    ModelOutput,
    SummedLoss,
    TrainableTensors,
    run_adamw,
)

if TYPE_CHECKING:
    from rapt.models import Backbone

__all__ = ["KIND", "AnswerCE", "EncodedPairs", "LLMTuningConfig", "TunedLLM", "encode_pairs",
           "train_llm_attacker"]

KIND = Kind("rapt-llm-attacker", 1, "adapter.safetensors", "LLM attacker adapter")

Pair = tuple[str, str]  # (privatized text, original text)


@dataclass
class LLMTuningConfig:
    """``lr`` (AdamW, linear warm-up over ``warmup`` of the steps, then decay to 0), ``epochs``,
    ``batch_size`` (pairs), ``lora_r`` (rank; scaling alpha = 2r), ``targets`` (peft's module
    names, or a peft keyword such as ``"all-linear"``: every linear layer but the output head;
    a reconstruction needs more than the attention's query and value), ``max_tokens`` (LLM
    tokens of prompt + answer + EOS; longer pairs are left out of training), ``seed`` (LoRA
    init and data order), ``max_change`` (the attacker's reply filter with this adapter, picked
    on held-out public rows; None: the few-shot attacker's default)."""

    lr: float = 2e-4
    epochs: int = 1
    batch_size: int = 8
    lora_r: int = 16
    targets: str | tuple[str, ...] = "all-linear"
    max_tokens: int = 256
    warmup: float = 0.06
    weight_decay: float = 0.0
    seed: int = 0
    max_change: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.targets, list):  # read back from JSON
            self.targets = tuple(self.targets)
        for name in ("lr", "epochs", "batch_size", "lora_r", "max_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_change is not None and not 0.0 <= self.max_change <= 1.0:
            raise ValueError(f"max_change is a share of a row's tokens, in [0, 1]; got "
                             f"{self.max_change}")


class TunedLLM:
    """A causal LLM with a LoRA adapter trained to reconstruct privatized text.

    ``backbone`` is a :class:`rapt.models.Backbone` over a private copy of the base LLM with the
    adapter in it (the caller's base is never changed): what the attacker generates with.
    ``meta`` holds the provenance (base LLM, η or η band, corpus, rows, steps)."""

    def __init__(self, base: Backbone, config: LLMTuningConfig, meta: dict | None = None) -> None:
        from rapt.tuning.tuners import add_lora, copy_without_hooks

        if base.kind != "causal" or base.model is None:
            raise ValueError(f"the LLM attacker needs a causal LM, {base.name!r} is {base.kind}")
        self.config = config
        self.meta = {"base": base.name, **dict(meta or {})}
        model = copy_without_hooks(base.model)
        add_lora(model, r=config.lora_r, alpha=2 * config.lora_r, targets=config.targets,
                 seed=config.seed)
        self.backbone = replace(base, name=f"{base.name}+attacker-lora", model=model.eval())

    @property
    def model(self) -> nn.Module:
        return self.backbone.model

    def trained_tensors(self) -> dict[str, Tensor]:
        """The LoRA tensors: what trains and what is saved."""
        return {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}

    def save(self, folder: str | Path) -> Path:
        """``adapter.safetensors`` + ``config.json`` (format, config, meta); -> the folder."""
        return save_artifact(folder, self.trained_tensors(), asdict(self.config), self.meta,
                             kind=KIND)

    @classmethod
    def load(cls, folder: str | Path, base: Backbone | str | None = None) -> TunedLLM:
        """The adapter saved in ``folder`` on ``base`` (a loaded causal backbone, a name or path
        for :func:`rapt.models.load_backbone`, or None: the base LLM its provenance names);
        raises :class:`rapt.artifacts.ArtifactError` naming the file."""
        tensors, cfg, meta = load_artifact(folder, KIND)
        try:
            config = LLMTuningConfig(**cfg)
        except (TypeError, ValueError) as e:
            raise ArtifactError(f"{Path(folder) / 'config.json'}: field 'config': {e}") from e
        if base is None or isinstance(base, str):
            from rapt.models import load_backbone

            base = load_backbone(base or meta.get("base"), kind="causal")
        if meta.get("hidden_size") not in (None, base.hidden_size):
            raise ArtifactError(f"{Path(folder) / KIND.tensors_file}: trained on "
                                f"{meta.get('base')!r} (hidden size {meta['hidden_size']}), not "
                                f"on {base.name!r} (hidden size {base.hidden_size})")
        tuned = cls(base, config, {k: v for k, v in meta.items() if k != "base"})
        tuned.meta["base"] = meta.get("base", base.name)
        try:
            TrainableTensors(tuned.model).load_state_dict(
                {k: v.to(next(tuned.model.parameters()).device) for k, v in tensors.items()})
        except (ValueError, RuntimeError) as e:
            raise ArtifactError(f"{Path(folder) / KIND.tensors_file}: {e}") from e
        return tuned


# --------------------------------------------------------------------------- data


@dataclass
class EncodedPairs:
    """Training pairs as LLM ids, right-padded: ``ids`` and ``mask`` (N, L); ``labels`` (N, L)
    the id at each answer position (the original's tokens and EOS), -100 on the prompt and
    padding; ``dropped``: pairs longer than ``max_tokens``, left out."""

    ids: Tensor
    mask: Tensor
    labels: Tensor
    dropped: int = 0
    answer_tokens: int = field(default=0)


def encode_pairs(tokenizer: Any, pairs: Sequence[Pair], max_tokens: int) -> EncodedPairs:
    """Each (privatized, original) text pair as the attacker's zero-shot prompt for the
    privatized text, then " original" and EOS (the prompt and the answer are tokenized apart,
    as the attacker tokenizes the prompt alone and reads the reply after it)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("fine-tuning the LLM attacker needs a tokenizer with an EOS token "
                         "(it ends each answer, and generation stops there)")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    rows: list[tuple[list[int], list[int]]] = []
    dropped = 0
    for noisy, clean in pairs:
        prompt = tokenizer(build_prompt([], noisy), add_special_tokens=False,  # as the attacker
                           split_special_tokens=False)["input_ids"]
        answer = [*tokenizer(f" {clean}", add_special_tokens=False)["input_ids"], int(eos)]
        if len(prompt) + len(answer) > max_tokens:
            dropped += 1
            continue
        rows.append((list(prompt), answer))
    if not rows:
        raise ValueError(f"no training pair fits in max_tokens={max_tokens} LLM tokens (prompt "
                         f"+ answer); raise max_tokens or pass shorter sentences")
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        ids[i, :len(p) + len(a)] = torch.tensor(p + a)
        mask[i, :len(p) + len(a)] = 1
        labels[i, len(p):len(p) + len(a)] = torch.tensor(a)
    return EncodedPairs(ids, mask, labels, dropped, sum(len(a) for _, a in rows))


@dataclass
class AnswerCE:
    """Next-token cross-entropy on the answer positions only (``labels`` != -100): the logit at
    position t predicts the token at t + 1, so the prompt is read but never predicted.
    ``out.logits`` is (B, L, V). Per example: the mean over its answer tokens; ``answer_acc``
    (per token) is greedy decoding's accuracy with the true answer so far (teacher forcing)."""

    labels: Tensor
    weight: float = 1.0

    def __call__(self, out: ModelOutput, idx: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        logits = out.logits[:, :-1]
        tgt = self.labels[idx][:, 1:out.logits.shape[1]].to(logits.device)
        ce = nn.functional.cross_entropy(logits.float().transpose(1, 2), tgt, ignore_index=-100,
                                         reduction="none")  # (B, L - 1)
        valid = tgt != -100
        loss = ce.sum(1) / valid.sum(1).clamp(min=1)
        right = (logits.argmax(-1) == tgt).float().detach()
        return loss, {"answer_acc": right[valid]}


# --------------------------------------------------------------------------- training


def train_llm_attacker(llm_backbone: Backbone, pairs: Sequence[Pair],
                       config: LLMTuningConfig | None = None, *, meta: dict | None = None,
                       progress: Callable[[dict], None] | None = None,
                       should_stop: Callable[[], bool] | None = None) -> TunedLLM:
    """LoRA-tune a copy of the causal LM ``llm_backbone`` on (privatized text, original text)
    pairs of *public* text (:func:`encode_pairs`); -> the :class:`TunedLLM`.

    ``meta``: provenance recorded with the adapter (η or η band, corpus, ...); the base LLM,
    pair and token counts, steps and the last history record are added. ``progress`` gets
    :func:`rapt.training.loop.run_loop`'s records (loss, answer_acc, lr, ...); ``should_stop``
    ends the run early (the adapter keeps what it learnt, ``meta["stopped"]`` says so)."""
    config = config or LLMTuningConfig()
    tuned = TunedLLM(llm_backbone, config, meta)
    data = encode_pairs(llm_backbone.tokenizer, pairs, config.max_tokens)
    model = tuned.model
    dev = next(model.parameters()).device
    model.train()

    def forward(idx: Tensor) -> ModelOutput:
        n = int(data.mask[idx].sum(1).max())  # pad each batch to its own longest pair
        logits = model(input_ids=data.ids[idx, :n].to(dev),
                       attention_mask=data.mask[idx, :n].to(dev), use_cache=False).logits
        return ModelOutput(logits, None, logits)

    n = int(data.ids.shape[0])
    step = MeanStep(SummedLoss(forward, [AnswerCE(data.labels)]), n, config.batch_size,
                    config.epochs, config.seed)
    with torch.random.fork_rng(devices=[], enabled=True):
        torch.manual_seed(config.seed)  # dropout, if the LLM has any
        state = run_adamw(step, model, "llm-attacker", "lora", n, lr=config.lr,
                          weight_decay=config.weight_decay, warmup=config.warmup,
                          progress=progress, should_stop=should_stop)
    model.eval()
    tuned.meta.update({"base": llm_backbone.name, "hidden_size": llm_backbone.hidden_size,
                       "pairs": n, "dropped": data.dropped, "answer_tokens": data.answer_tokens,
                       "steps": state.step, "stopped": state.stopped,
                       "last": state.history[-1] if state.history else None})
    return tuned
