"""Mixed-task inference: rows of many customers' tuned prompts in one forward pass.

The backbone is shared and frozen, so one pass can serve rows of many prompts as long as each
row carries its own prompt in (Li & Liang 2021; RAPT §1). Per method ("family"):

- **prompt**: each row's soft prompt is prepended to its embeddings (``tuners.prompt_forward``
  with the prompts stacked along the batch). Prompts of different lengths would shift the
  input positions, so one pass serves one prompt length.
- **prefix**: each row's key/values fill the past slots of every layer, left-padded to the
  longest prefix of the pass; the attention mask (past + current positions) hides the padded
  slots and explicit positions keep the real tokens at 0..n-1 whatever the prefix length, as
  for one prefix (``tuners.prefix_forward``).
- **lora**: every targeted linear adds each row's own low-rank update, gathered per row and
  applied as batched matmuls (``rapt.tuning.multi_lora``, the technique of Punica / S-LoRA);
  adapters are never merged and no per-customer copy of the backbone is built.

Full fine-tuning and objects without a tuning config cannot share a pass; the caller
(``rapt.service.inference``) sends those one pass per prompt, the reference path that every
mixed path equals up to floating-point summation order.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rapt.precision import autocast, resolve_precision
from rapt.tuning.multi_lora import Adapter, adapter_from_peft_state, per_row_adapters
from rapt.tuning.tune import pad_batch, task_mask
from rapt.tuning.tuners import (
    base_model,
    prefix_forward,
    prompt_forward,
    segment_ids,
    segment_sep_id,
)

Item = tuple[Any, list[list[int]]]  # (tuned prompt, rows of token ids)


@dataclass(frozen=True)
class Mixable:
    """What a mixed pass needs from one tuned prompt. Prompts of one ``family`` share passes:
    ("prompt", N), ("prefix", 0) or ("lora", 0), and of one ``precision`` (the prompt's
    ``config.precision`` resolved on the backbone's device: rapt.precision)."""

    family: tuple[str, int]
    head: nn.Module
    plain_len: int
    offset: int
    # prompt: (N, h); prefix: key/values (L, 2, kv_heads, N, head_dim); lora: an Adapter
    weights: Any
    precision: str = "fp32"

    @property
    def extra_positions(self) -> int:
        """Positions the pass adds to a row of this prompt (attended to, not output)."""
        if self.family[0] == "lora":
            return 0
        return int(self.weights.shape[0] if self.family[0] == "prompt" else self.weights.shape[3])


_SPECS: dict[int, tuple[int, Mixable]] = {}  # id(prompt) -> (id(backbone.model), spec)


def mixable(backbone: Any, prompt: Any) -> Mixable | None:
    """``prompt``'s part in a mixed pass on ``backbone``, or None when it cannot share one
    (full fine-tuning, objects without a tuning config, LoRA variants beyond plain A/B).
    Cached per prompt object while it lives."""
    hit = _SPECS.get(id(prompt))
    if hit is not None and hit[0] == id(backbone.model):
        return hit[1]
    spec = _build(backbone, prompt)
    if spec is not None:
        if id(prompt) not in _SPECS:
            weakref.finalize(prompt, _SPECS.pop, id(prompt), None)
        _SPECS[id(prompt)] = (id(backbone.model), spec)
    return spec


def _build(backbone: Any, prompt: Any) -> Mixable | None:
    method = getattr(getattr(prompt, "config", None), "method", None)
    dev = next(iter(backbone.model.parameters())).device
    prec = resolve_precision(getattr(prompt.config, "precision", "fp32"), dev) if method \
        else "fp32"
    if method in ("prompt", "prefix") and hasattr(prompt, "build"):
        model = prompt.build(backbone)
        if method == "prompt":
            w = model.tuner.prompt.detach()
            family = ("prompt", w.shape[0])
        else:
            w = model.tuner.key_values(1)[:, :, 0].detach()  # computed once: eval mode
            family = ("prefix", 0)
        return Mixable(family, model.head, model.plain_len, model.offset, w, prec)
    if method == "lora" and hasattr(prompt, "build_head"):
        try:
            adapter = adapter_from_peft_state(prompt.tensors, "tuner.copy.", device=dev)
        except ValueError:  # not a plain LoRA: the per-prompt path runs it through peft
            return None
        meta = prompt.meta
        return Mixable(("lora", 0), prompt.build_head(backbone), int(meta.get("plain_len", 0)),
                       int(meta.get("plain_offset", 0)), adapter, prec)
    return None


def forward(backbone: Any, items: Sequence[Item], max_rows: int = 64,
            max_padding: float = 1.3) -> list[Tensor]:
    """Probabilities (n_i, C_i) per item; every item's prompt must be ``mixable``. Rows of
    one family share passes whatever prompt they belong to."""
    specs = []
    for p, _ in items:
        spec = mixable(backbone, p)
        if spec is None:
            raise ValueError(f"{type(p).__name__} with method "
                             f"{getattr(getattr(p, 'config', None), 'method', None)!r} cannot "
                             "share a mixed pass; run it with its own predict_proba")
        specs.append(spec)
    out: list[Tensor | None] = [None] * len(items)
    families: dict[tuple, list[int]] = collections.defaultdict(list)
    for i, s in enumerate(specs):
        families[(s.family, s.precision)].append(i)
    for idx in families.values():
        probs = group_forward(backbone, [specs[i] for i in idx], [items[i][1] for i in idx],
                              max_rows, max_padding)
        for i, p in zip(idx, probs, strict=True):
            out[i] = p
    return out  # type: ignore[return-value]


@torch.no_grad()
def group_forward(backbone: Any, specs: Sequence[Mixable], rows: Sequence[Sequence[list[int]]],
                  max_rows: int = 64, max_padding: float = 1.3) -> list[Tensor]:
    """Prompts of one family, ``specs[i]`` on ``rows[i]``, rows of all prompts mixed in each
    pass. Rows are sorted by length and a new pass starts only when padding would make a pass
    cost more than ``max_padding`` times its real positions (prompts and prefixes included).

    Returns per-item probabilities (n_i, C_i); equal to each prompt's own ``predict_proba``
    up to floating-point summation order."""
    if len({(s.family, s.precision) for s in specs}) > 1:
        raise ValueError("one family and precision per group, got "
                         f"{sorted({(s.family, s.precision) for s in specs})}")
    flat = sorted((len(r), specs[i].extra_positions, i, j)
                  for i, rs in enumerate(rows) for j, r in enumerate(rs))
    out = [torch.empty(len(rs), 0) for rs in rows]
    chunk: list[tuple[int, int, int, int]] = []
    real = widest = 0
    for entry in [*flat, None]:
        if chunk and (entry is None or len(chunk) >= max_rows
                      or (len(chunk) + 1) * (entry[0] + max(widest, entry[1]))
                      > max_padding * (real + entry[0] + entry[1])):
            _one_pass(backbone, specs, rows, [(i, j) for *_, i, j in chunk], out)
            chunk, real, widest = [], 0, 0
        if entry is not None:
            chunk.append(entry)
            real += entry[0] + entry[1]
            widest = max(widest, entry[1])
    return out


def _one_pass(backbone: Any, specs: Sequence[Mixable], rows: Sequence[Sequence[list[int]]],
              picks: list[tuple[int, int]], out: list[Tensor]) -> None:
    """One backbone pass over rows ``rows[i][j]`` for (i, j) in picks; fills ``out[i][j]``."""
    dev = next(iter(backbone.model.parameters())).device
    ids, mask = pad_batch([rows[i][j] for i, j in picks], backbone.tokenizer.pad_token_id, dev)
    family = specs[picks[0][0]].family[0]
    sep = segment_sep_id(backbone)
    types = segment_ids(ids, mask, sep) if sep is not None else None
    with autocast(specs[picks[0][0]].precision, dev):
        hidden = _PASSES[family](backbone.model, [specs[i].weights for i, _ in picks], ids,
                                 mask, types)
    hidden = hidden.float()  # heads and softmax in fp32, as in RaptModel
    by_item: dict[int, list[int]] = collections.defaultdict(list)
    for k, (i, _) in enumerate(picks):
        by_item[i].append(k)
    for i, ks in by_item.items():
        s = specs[i]
        probs = s.head(hidden[ks], task_mask(mask[ks], s.plain_len, s.offset))
        probs = probs.float().softmax(-1).cpu()
        if out[i].shape[1] != probs.shape[1]:
            out[i] = torch.empty(len(rows[i]), probs.shape[1])
        out[i][[picks[k][1] for k in ks]] = probs


def _distinct(weights: Sequence[Any], device: torch.device) -> tuple[list[Any], Tensor]:
    """(distinct objects in first-seen order, index (B,) of each row's)."""
    pos: dict[int, int] = {}
    for w in weights:
        pos.setdefault(id(w), len(pos))
    uniq = list({id(w): w for w in weights}.values())
    return uniq, torch.tensor([pos[id(w)] for w in weights], device=device)


# One per family: (shared model, each row's prompt weights, ids (B, n), mask (B, n), segment
# ids (B, n) or None) -> hidden states of the input positions (B, n, h).

def _prompt_pass(model: nn.Module, prompts: Sequence[Tensor], ids: Tensor, mask: Tensor,
                 types: Tensor | None) -> Tensor:
    uniq, index = _distinct(prompts, ids.device)
    stacked = torch.stack(uniq)[index]
    if types is not None:  # the virtual tokens are segment 0, as in PromptTuner
        types = torch.cat([types.new_zeros(len(ids), stacked.shape[1]), types], 1)
    return prompt_forward(base_model(model), stacked, ids, mask, types)


def _prefix_pass(model: nn.Module, kvs: Sequence[Tensor], ids: Tensor, mask: Tensor,
                 types: Tensor | None) -> Tensor:
    uniq, index = _distinct(kvs, ids.device)
    width = max(kv.shape[3] for kv in uniq)
    # Left-pad each prefix to the longest: the real slots stay next to the input, and masked
    # slots get zero attention weight whatever their (zero) keys.
    stacked = torch.stack([nn.functional.pad(kv, (0, 0, width - kv.shape[3], 0))
                           for kv in uniq], 2)  # (L, 2, P, kv_heads, width, head_dim)
    slots = torch.arange(width, device=ids.device)
    lengths = torch.tensor([kv.shape[3] for kv in uniq], device=ids.device)
    prefix_mask = (slots >= width - lengths[:, None]).to(mask.dtype)  # (P, width)
    return prefix_forward(base_model(model), stacked[:, :, index], prefix_mask[index], ids, mask,
                          types)


def _lora_pass(model: nn.Module, adapters: Sequence[Adapter], ids: Tensor, mask: Tensor,
               types: Tensor | None) -> Tensor:
    uniq, index = _distinct(adapters, ids.device)
    # Adapter paths are relative to the whole model (the LoRA tuner's private copy of it).
    with per_row_adapters(model, uniq, index):
        seg = {} if types is None else {"token_type_ids": types}
        return base_model(model)(input_ids=ids, attention_mask=mask, use_cache=False,
                                 **seg).last_hidden_state


_PASSES = {"prompt": _prompt_pass, "prefix": _prefix_pass, "lora": _lora_pass}
