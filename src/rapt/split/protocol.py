"""The messages between customer and provider, checked on arrival.

Training step k (SAP Algorithm 1 lines 21-27, plus §4.2's unfrozen bottom):

    customer -> provider   Activations(step=k, hidden (B, n, h), mask (B, n))
    provider -> customer   TopOutput(step=k, output (B, h))          the top's output g
    customer -> provider   OutputGrad(step=k, grad (B, h))           ∂l/∂g; labels stay home
    provider -> customer   ActivationGrad(step=k, grad (B, n, h))    only when the bottom trains

Over HTTP a frozen bottom's rows cross once, before training: ``Release(offset, hidden (T, h),
lengths (B,))`` chunks, then each step names its rows with ``BatchRef(step=k, rows (B,))`` in
place of ``Activations`` (:mod:`rapt.split.wire` frames every message as safetensors).

Every message is untrusted input to the side that receives it: ``__post_init__`` checks types,
shapes, dtypes, finiteness and the step id and raises :class:`SplitProtocolError` naming the
field, so a malformed message fails where it arrives (an HTTP route answers 422).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ActivationGrad", "Activations", "BatchRef", "OutputGrad", "Release",
           "SplitProtocolError", "TopOutput"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_MASKS = (torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


class SplitProtocolError(ValueError):
    """A split-learning message is malformed or out of order; ``field`` names the culprit."""

    def __init__(self, message: str, field: str, problem: str) -> None:
        self.message_type = message
        self.field = field
        self.problem = problem
        super().__init__(f"{message}.{field}: {problem}")


def _step(msg: str, step: object) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise SplitProtocolError(msg, "step", f"must be an integer >= 0, got {step!r}")


def _float_tensor(msg: str, name: str, t: object, dims: int) -> None:
    if not isinstance(t, Tensor):
        raise SplitProtocolError(msg, name, f"must be a tensor, got {type(t).__name__}")
    if t.dtype not in _FLOATS:
        raise SplitProtocolError(msg, name, f"must be a floating tensor, got {t.dtype}")
    if t.dim() != dims:
        raise SplitProtocolError(msg, name, f"must have {dims} dimensions, got shape "
                                            f"{tuple(t.shape)}")
    if any(s == 0 for s in t.shape):
        raise SplitProtocolError(msg, name, f"is empty (shape {tuple(t.shape)})")
    if not bool(torch.isfinite(t).all()):
        raise SplitProtocolError(msg, name, "contains NaN or infinite values")


def _hidden_mask(msg: str, hidden: object, m: object) -> None:
    """``hidden`` (B, n, h) finite float; ``m`` (B, n) 0/1, right-padded, no empty row."""
    _float_tensor(msg, "hidden", hidden, 3)
    if not isinstance(m, Tensor):
        raise SplitProtocolError(msg, "mask", f"must be a tensor, got {type(m).__name__}")
    if m.dtype not in _MASKS:
        raise SplitProtocolError(msg, "mask", f"must be a bool or integer tensor, got {m.dtype}")
    if tuple(m.shape) != tuple(hidden.shape[:2]):
        raise SplitProtocolError(msg, "mask", f"shape {tuple(m.shape)} does not match hidden's "
                                              f"first two dimensions {tuple(hidden.shape[:2])}")
    mi = m.long()
    if bool(((mi != 0) & (mi != 1)).any()):
        raise SplitProtocolError(msg, "mask", "values must be 0 or 1")
    if bool((mi.sum(1) == 0).any()):
        raise SplitProtocolError(msg, "mask", "a row has no valid position")
    # Right padding: positions and pooling assume the valid tokens come first.
    if bool((mi[:, 1:] > mi[:, :-1]).any()):
        raise SplitProtocolError(msg, "mask", "must be right-padded (1s, then 0s, in every row)")


@dataclass(frozen=True)
class Activations:
    """Customer -> provider: the (privatized) output of the bottom for one batch.

    ``hidden`` (B, n, h) float; ``mask`` (B, n) 0/1, right-padded, each row with >= 1 token.
    There is deliberately no label field."""

    step: int
    hidden: Tensor
    mask: Tensor

    def __post_init__(self) -> None:
        _step("Activations", self.step)
        _hidden_mask("Activations", self.hidden, self.mask)


@dataclass(frozen=True)
class TopOutput:
    """Provider -> customer: the top's output g for the batch of ``step``, (B, h) float."""

    step: int
    output: Tensor

    def __post_init__(self) -> None:
        _step("TopOutput", self.step)
        _float_tensor("TopOutput", "output", self.output, 2)


@dataclass(frozen=True)
class OutputGrad:
    """Customer -> provider: ∂l/∂g for the batch of ``step``, (B, h) float."""

    step: int
    grad: Tensor

    def __post_init__(self) -> None:
        _step("OutputGrad", self.step)
        _float_tensor("OutputGrad", "grad", self.grad, 2)


@dataclass(frozen=True)
class ActivationGrad:
    """Provider -> customer (unfrozen bottom only): ∂l/∂hidden, (B, n, h) float."""

    step: int
    grad: Tensor

    def __post_init__(self) -> None:
        _step("ActivationGrad", self.step)
        _float_tensor("ActivationGrad", "grad", self.grad, 3)


@dataclass(frozen=True)
class Release:
    """Customer -> provider, frozen bottom only: rows ``offset`` .. ``offset + B - 1`` of the
    one release of the training set (SAP §4.2: privatized and encoded once), packed without
    padding: ``hidden`` (T, h) holds the rows' valid positions one row after another,
    ``lengths`` (B,) int the tokens per row (sum T). Uploaded in chunks before training;
    batches then name rows (:class:`BatchRef`), so every example crosses the wire once."""

    offset: int
    hidden: Tensor
    lengths: Tensor

    def __post_init__(self) -> None:
        if isinstance(self.offset, bool) or not isinstance(self.offset, int) or self.offset < 0:
            raise SplitProtocolError("Release", "offset",
                                     f"must be an integer >= 0, got {self.offset!r}")
        _float_tensor("Release", "hidden", self.hidden, 2)
        n = self.lengths
        if not isinstance(n, Tensor) or n.dtype not in (torch.int32, torch.int64):
            raise SplitProtocolError("Release", "lengths", "must be an int32 or int64 tensor, "
                                     f"got {getattr(n, 'dtype', type(n).__name__)}")
        if n.dim() != 1 or n.numel() == 0 or bool((n < 1).any()):
            raise SplitProtocolError("Release", "lengths", "must be 1-dimensional, non-empty "
                                                           "and >= 1 everywhere")
        if int(n.sum()) != self.hidden.shape[0]:
            raise SplitProtocolError("Release", "lengths", f"sum to {int(n.sum())}, hidden has "
                                                           f"{self.hidden.shape[0]} positions")

    def rows(self) -> list[Tensor]:
        """The rows' hidden states, (n_i, h) each."""
        return list(self.hidden.split(self.lengths.tolist()))


@dataclass(frozen=True)
class BatchRef:
    """Customer -> provider, frozen bottom: batch ``step`` is rows ``rows`` (B,) of the uploaded
    :class:`Release` (distinct indices, int32/int64). Stands in for :class:`Activations`."""

    step: int
    rows: Tensor

    def __post_init__(self) -> None:
        _step("BatchRef", self.step)
        r = self.rows
        if not isinstance(r, Tensor) or r.dtype not in (torch.int32, torch.int64):
            raise SplitProtocolError("BatchRef", "rows", "must be an int32 or int64 tensor, got "
                                     f"{getattr(r, 'dtype', type(r).__name__)}")
        if r.dim() != 1 or r.numel() == 0:
            raise SplitProtocolError("BatchRef", "rows",
                                     f"must be 1-dimensional and non-empty, got shape "
                                     f"{tuple(r.shape)}")
        if bool((r < 0).any()) or len(set(r.tolist())) != r.numel():
            raise SplitProtocolError("BatchRef", "rows", "indices must be distinct and >= 0")
