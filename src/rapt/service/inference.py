"""Micro-batched inference: concurrent requests for one backbone share forward passes.

Requests wait at most ``max_wait_s`` for company; a batch then holds rows of possibly many
tuned prompts. ``forward`` turns one batch into per-request probabilities; the default sends the
rows of every prompt that can share a pass (soft prompts, prefixes, LoRA: `rapt.service.mixed`)
through mixed passes, one family per pass, and runs the rest (full fine-tuning) one pass per
distinct prompt. This module uses `rapt.service.mixed`, never the reverse.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rapt.service.mixed import Item

log = logging.getLogger("rapt.service")

Forward = Callable[[Any, Sequence["Item"]], list[torch.Tensor]]


class InferenceQueueFullError(RuntimeError):
    pass


# Encoders whose position ids start after the padding index (RoBERTa's layout).
_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text",
                     "longformer", "xmod"}


def backbone_positions(backbone: Any) -> int | None:
    """How many input positions the backbone can embed (None: no known limit)."""
    cfg = getattr(getattr(backbone, "model", None), "config", None)
    n = getattr(cfg, "max_position_embeddings", None)
    if not isinstance(n, int) or n <= 0:
        return None
    if getattr(cfg, "model_type", "") in _OFFSET_POSITIONS:
        n -= int(getattr(cfg, "pad_token_id", 1) or 0) + 1
    return n


def positions_used(method: str, num_virtual_tokens: int) -> int:
    """Input positions a tuned prompt takes before the row: a soft prompt is prepended to the
    input; prefix key/values and LoRA/full weights take none (rapt.tuning.tuners)."""
    return int(num_virtual_tokens) if method == "prompt" else 0


def prompt_positions(prompt: Any) -> int:
    """``positions_used`` of a loaded prompt (0 for objects without a tuning config)."""
    cfg = getattr(prompt, "config", None)
    if cfg is None:
        return 0
    return positions_used(getattr(cfg, "method", ""), getattr(cfg, "num_virtual_tokens", 0))


def per_prompt_forward(backbone: Any, items: Sequence[Item]) -> list[torch.Tensor]:
    """One ``predict_proba`` per distinct prompt over all of its rows in the batch: the
    reference that the mixed passes equal."""
    by_prompt: dict[int, list[int]] = collections.defaultdict(list)
    for i, (prompt, _) in enumerate(items):
        by_prompt[id(prompt)].append(i)
    out: list[torch.Tensor | None] = [None] * len(items)
    for idx in by_prompt.values():
        prompt = items[idx[0]][0]
        rows = [r for i in idx for r in items[i][1]]
        probs = prompt.predict_proba(backbone, rows, batch_size=max(len(rows), 1))
        start = 0
        for i in idx:
            n = len(items[i][1])
            out[i] = probs[start:start + n]
            start += n
    return out  # type: ignore[return-value]


def default_forward(backbone: Any, items: Sequence[Item]) -> list[torch.Tensor]:
    """Mixed passes for the items whose prompts can share one, a pass per prompt for the rest.
    A lone mixable prompt takes the mixed path too: same cost, and a LoRA prompt then needs no
    private copy of the backbone."""
    # Imported here: mixed pulls in transformers (through the tuners), which the service's key
    # and store commands never need.
    from rapt.service import mixed

    mix = [i for i, (p, _) in enumerate(items) if mixed.mixable(backbone, p) is not None]
    rest = sorted(set(range(len(items))) - set(mix))
    out: list[torch.Tensor | None] = [None] * len(items)
    for idx, fn in ((mix, mixed.forward), (rest, per_prompt_forward)):
        if idx:
            for i, p in zip(idx, fn(backbone, [items[i] for i in idx]), strict=True):
                out[i] = p
    return out  # type: ignore[return-value]


@dataclass
class _Request:
    prompt: Any
    rows: list[list[int]]
    future: Future = field(default_factory=Future)


@dataclass
class BatchStats:
    requests: int = 0
    rows: int = 0
    batches: int = 0  # micro-batches taken from the queue
    forward_passes: int = 0  # backbone forward passes they needed
    max_prompts_in_batch: int = 0


class MicroBatcher:
    """One thread per backbone that groups queued requests into forward passes."""

    def __init__(self, backbone: Any, forward: Forward = default_forward, *,
                 max_wait_s: float = 0.005, max_rows: int = 64, max_pending_rows: int = 4096):
        self.backbone = backbone
        self.forward = forward
        self.max_wait_s = max_wait_s
        self.max_rows = max_rows
        self.max_pending_rows = max_pending_rows
        self.stats = BatchStats()
        self._pending: collections.deque[_Request] = collections.deque()
        self._pending_rows = 0
        self._last_batch_size = 0
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="rapt-infer", daemon=True)
        self._hook = None
        model = getattr(backbone, "model", None)
        if model is not None:
            from rapt.tuning.tuners import base_model

            # Counts body passes made by this thread only (training shares the module).
            self._hook = base_model(model).register_forward_hook(self._count_pass)
        self._thread.start()

    def _count_pass(self, *_: Any) -> None:
        if threading.current_thread() is self._thread:
            self.stats.forward_passes += 1

    def submit(self, prompt: Any, rows: list[list[int]]) -> Future:
        req = _Request(prompt, rows)
        with self._cond:
            if self._pending_rows + len(rows) > self.max_pending_rows:
                raise InferenceQueueFullError(
                    f"the inference queue is full (limit max_inference_queue="
                    f"{self.max_pending_rows} rows); retry shortly")
            self._pending.append(req)
            self._pending_rows += len(rows)
            self._cond.notify()
        return req.future

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(5)
        if self._hook is not None:
            self._hook.remove()

    def _take_batch(self) -> list[_Request]:
        with self._cond:
            while not self._pending and not self._stop:
                self._cond.wait()
            if self._stop:
                return []
            # Wait for company only when requests have been arriving together: a lone client
            # would pay the wait on every request for nothing.
            wait = self.max_wait_s if self._last_batch_size > 1 or len(self._pending) > 1 else 0
            deadline = time.monotonic() + wait
            batch = [self._pending.popleft()]
            rows = len(batch[0].rows)
            while rows < self.max_rows:
                if self._pending:
                    if rows + len(self._pending[0].rows) > self.max_rows:
                        break
                    req = self._pending.popleft()
                    batch.append(req)
                    rows += len(req.rows)
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._pending_rows -= rows
            self._last_batch_size = len(batch)
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take_batch()
            if not batch:
                return
            s = self.stats
            s.requests += len(batch)
            s.rows += sum(len(r.rows) for r in batch)
            s.batches += 1
            s.max_prompts_in_batch = max(s.max_prompts_in_batch,
                                         len({id(r.prompt) for r in batch}))
            try:
                with torch.inference_mode():
                    probs = self.forward(self.backbone, [(r.prompt, r.rows) for r in batch])
            except Exception as e:
                if len(batch) == 1:
                    batch[0].future.set_exception(e)
                    continue
                # One request's failure must not fail the others, nor reach them: run each
                # alone, so every request gets its own result or its own error.
                log.warning("a micro-batch of %d requests failed (%s); running them one by one",
                            len(batch), type(e).__name__)
                self._one_by_one(batch)
                continue
            for r, p in zip(batch, probs, strict=True):
                r.future.set_result(p)

    def _one_by_one(self, batch: list[_Request]) -> None:
        for r in batch:
            try:
                with torch.inference_mode():
                    p = self.forward(self.backbone, [(r.prompt, r.rows)])[0]
            except Exception as e:  # reported by the route, with an error id
                r.future.set_exception(e)
            else:
                r.future.set_result(p)
