"""Mixed-task inference: rows of different soft prompts in one forward pass.

Prompt tuning leaves the backbone untouched, so a batch can hold rows of many tasks: each row
gets its own prompt prepended (the prompts are stacked along the batch), the frozen body runs
once, and each row's own task head reads its hidden states (Li & Liang 2021; RAPT §1).
Prompts of different lengths would shift the input positions, so one pass serves one prompt
length; other methods (prefix, LoRA) fall back to a pass per prompt.

Built from the public pieces of ``rapt.trainer.TunedPrompt.build``: ``RaptModel.tuner``
(a ``PromptTuner`` with ``prompt`` (N, h) and ``body``), ``head``, ``plain_len``, ``offset``.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

Item = tuple[Any, list[list[int]]]


def _prompt_model(backbone: Any, prompt: Any) -> Any | None:
    """The built inference model when ``prompt`` is a soft prompt (else None)."""
    cfg = getattr(prompt, "config", None)
    if getattr(cfg, "method", None) != "prompt" or not hasattr(prompt, "build"):
        return None
    model = prompt.build(backbone)
    if not hasattr(model.tuner, "prompt"):
        return None
    dev = next(iter(backbone.model.parameters())).device
    if getattr(model, "_service_device", None) != dev:  # build() leaves the head on the CPU
        model.to(dev)
        model._service_device = dev
    return model


def supports(backbone: Any, prompts: Sequence[Any]) -> bool:
    """True when at least two of the prompts can share a pass."""
    lengths = collections.Counter()
    for p in prompts:
        m = _prompt_model(backbone, p)
        if m is not None:
            lengths[m.tuner.prompt.shape[0]] += 1
    return any(n > 1 for n in lengths.values())


@torch.no_grad()
def prompt_group_forward(backbone: Any, models: Sequence[Any],
                         rows: Sequence[Sequence[list[int]]], max_rows: int = 64,
                         max_padding: float = 1.3) -> list[Tensor]:
    """Soft prompts of equal length N, ``models[i]`` on ``rows[i]``, rows of all prompts mixed
    in each pass. Rows are sorted by length and a new pass starts only when padding would
    make a pass cost more than ``max_padding`` times its real tokens (prompt included).

    Returns per-item probabilities (n_i, C_i); equal to each prompt's own ``predict_proba``
    up to floating-point summation order."""
    N = models[0].tuner.prompt.shape[0]
    flat = sorted((len(r), i, j) for i, rs in enumerate(rows) for j, r in enumerate(rs))
    out = [torch.empty(len(rs), 0) for rs in rows]
    chunk: list[tuple[int, int, int]] = []
    real = 0
    for entry in [*flat, None]:
        if chunk and (entry is None or len(chunk) >= max_rows
                      or (len(chunk) + 1) * (entry[0] + N) > max_padding * (real + entry[0] + N)):
            _one_pass(backbone, models, rows, [(i, j) for _, i, j in chunk], out)
            chunk, real = [], 0
        if entry is not None:
            chunk.append(entry)
            real += entry[0] + N
    return out


def _one_pass(backbone: Any, models: Sequence[Any], rows: Sequence[Sequence[list[int]]],
              picks: list[tuple[int, int]], out: list[Tensor]) -> None:
    """One backbone pass over rows ``rows[i][j]`` for (i, j) in picks; fills ``out[i][j]``."""
    from rapt.trainer import pad_batch

    dev = next(iter(backbone.model.parameters())).device
    ids, mask = pad_batch([rows[i][j] for i, j in picks], backbone.tokenizer.pad_token_id, dev)
    N = models[0].tuner.prompt.shape[0]
    embeds = backbone.model.get_input_embeddings()(ids)
    prompts = torch.stack([models[i].tuner.prompt.to(embeds.dtype) for i, _ in picks])
    full_mask = torch.cat([mask.new_ones(len(picks), N), mask], dim=1)
    tuner = models[0].tuner
    hidden = tuner.body(inputs_embeds=torch.cat([prompts, embeds], 1), attention_mask=full_mask,
                        use_cache=False, **tuner.segments(ids, mask, N)).last_hidden_state[:, N:]
    by_item: dict[int, list[int]] = collections.defaultdict(list)
    for k, (i, _) in enumerate(picks):
        by_item[i].append(k)
    for i, ks in by_item.items():
        m = models[i]
        task_mask = mask[ks].clone()
        if m.plain_len:  # the head reads the input, not the plain-token states
            task_mask[:, m.offset:m.offset + m.plain_len] = 0
        probs = m.head(hidden[ks], task_mask).float().softmax(-1).cpu()
        if out[i].shape[1] != probs.shape[1]:
            out[i] = torch.empty(len(rows[i]), probs.shape[1])
        out[i][[picks[k][1] for k in ks]] = probs


def forward(backbone: Any, items: Sequence[Item]) -> list[Tensor]:
    """Probabilities per item: same-length soft prompts share a pass, the rest go alone."""
    from rapt.service.inference import per_prompt_forward

    out: list[Tensor | None] = [None] * len(items)
    groups: dict[int, list[int]] = collections.defaultdict(list)
    rest: list[int] = []
    models: dict[int, Any] = {}
    for i, (p, _) in enumerate(items):
        m = _prompt_model(backbone, p)
        if m is None:
            rest.append(i)
        else:
            models[i] = m
            groups[m.tuner.prompt.shape[0]].append(i)
    for idx in groups.values():
        probs = prompt_group_forward(backbone, [models[i] for i in idx],
                                     [items[i][1] for i in idx])
        for i, p in zip(idx, probs, strict=True):
            out[i] = p
    if rest:
        for i, p in zip(rest, per_prompt_forward(backbone, [items[i] for i in rest]),
                        strict=True):
            out[i] = p
    return out  # type: ignore[return-value]
