"""The split protocol's messages as bytes: one safetensors blob per message.

A message travels as safetensors (binary tensors, an 8-byte header length and a JSON header,
no pickle) whose ``__metadata__`` names the message type and holds its integer field (``step``
or ``offset``). :func:`decode` checks, before any tensor is built, the size limit, the header,
the message type, the exact set of tensor names and their dtypes; then the message's own
``__post_init__`` checks shapes, masks and finiteness (:mod:`rapt.split.protocol`). Every
problem is a :class:`SplitProtocolError` naming the field, which the service answers with 422.

Padding never travels: ``Activations`` and ``ActivationGrad`` go packed, the valid positions of
each row one after another, ``(T, h)``, with ``lengths`` (B,) and the padded ``width`` n in the
metadata (the mask is right-padded, so lengths say everything it says; the customer zeroes its
padding positions and the top gives them zero gradient, so nothing is lost). :func:`decode`
gives back the padded message. ``Release`` is packed by definition.

Bytes per message: ``8 + len(header) + sum(numel * itemsize)``, the header being ~150-250
bytes of JSON (names, dtypes, shapes, offsets, metadata).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import fields

import torch
from torch import Tensor

from rapt.split.protocol import (
    ActivationGrad,
    Activations,
    BatchRef,
    OutputGrad,
    Release,
    SplitProtocolError,
    TopOutput,
)

__all__ = ["MESSAGES", "decode", "encode", "pad_rows"]

MESSAGES: dict[str, type] = {c.__name__: c for c in (Activations, TopOutput, OutputGrad,
                                                      ActivationGrad, Release, BatchRef)}
_INT_FIELDS = ("step", "offset")
_FLOAT = {"F16", "BF16", "F32", "F64"}
_MASK = {"BOOL", "U8", "I8", "I16", "I32", "I64"}
# safetensors dtype names allowed per tensor field; anything else is refused from the header.
_DTYPES = {"hidden": _FLOAT, "output": _FLOAT, "grad": _FLOAT, "mask": _MASK,
           "rows": {"I32", "I64"}, "lengths": {"I32", "I64"}}
MAX_HEADER = 64 * 1024  # a message has at most two tensors: a few hundred bytes of header


# Messages whose (B, n, h) tensor travels packed: name of that tensor.
_PACKED = {"Activations": "hidden", "ActivationGrad": "grad"}
MAX_WIDTH = 1 << 16  # padded width a packed message may ask for
# ASCII digits only: str.isdigit() also takes "²" (int() then fails) and "٣" (int() reads 3).
_DIGITS = re.compile(r"[0-9]{1,18}")


def _meta_int(kind: str, name: str, raw: object, max_digits: int = 18) -> int:
    """An integer metadata field (``step``, ``offset``, ``width``): 1..max_digits ASCII
    digits, else SplitProtocolError."""
    if not isinstance(raw, str) or len(raw) > max_digits or not _DIGITS.fullmatch(raw):
        raise SplitProtocolError(kind, name, f"must be an integer >= 0 written in ASCII "
                                             f"digits, got {raw!r}")
    return int(raw)


def _parts(msg: object, lengths: Tensor | None) -> tuple[dict[str, str], dict[str, Tensor]]:
    name = type(msg).__name__
    if name not in MESSAGES:
        raise TypeError(f"not a split protocol message: {name}")
    meta, tensors = {"message": name}, {}
    for f in fields(msg):
        v = getattr(msg, f.name)
        if f.name in _INT_FIELDS:
            meta[f.name] = str(int(v))
        elif f.name != "mask":
            tensors[f.name] = v.detach().cpu()
    if name in _PACKED:
        key = _PACKED[name]
        if name == "Activations":
            lengths = msg.mask.long().sum(1)
        elif lengths is None:
            raise ValueError("encode(ActivationGrad) needs the lengths of its batch's rows")
        t = tensors[key]
        valid = torch.arange(t.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
        tensors[key] = t[valid]  # (T, h): row after row, valid positions only
        tensors["lengths"] = lengths.to(torch.int32)
        meta["width"] = str(int(t.shape[1]))
    return meta, {k: v.contiguous() for k, v in tensors.items()}


def encode(msg: object, *, lengths: Tensor | None = None) -> bytes:
    """Message -> safetensors bytes (float32 stays float32). ``lengths`` (B,): the valid
    positions per row, needed for an ``ActivationGrad`` (an ``Activations`` has its mask)."""
    from safetensors.torch import save

    meta, tensors = _parts(msg, lengths)
    return save(tensors, metadata=meta)


def _unpack(kind: str, packed: Tensor, lengths: Tensor, width: int,
            max_bytes: int) -> tuple[Tensor, Tensor]:
    """(T, h) + lengths (B,) -> padded (B, width, h) and mask (B, width)."""
    if lengths.dim() != 1 or lengths.numel() == 0 or bool((lengths < 1).any()):
        raise SplitProtocolError(kind, "lengths", "must be 1-dimensional, non-empty and >= 1")
    if packed.dim() != 2:
        raise SplitProtocolError(kind, _PACKED[kind], f"must be packed (T, h), got shape "
                                                      f"{tuple(packed.shape)}")
    if int(lengths.sum()) != packed.shape[0]:
        raise SplitProtocolError(kind, "lengths", f"sum to {int(lengths.sum())}, the packed "
                                                  f"tensor has {packed.shape[0]} positions")
    if not int(lengths.max()) <= width <= MAX_WIDTH:
        raise SplitProtocolError(kind, "width", f"{width} is not between the longest row "
                                                f"({int(lengths.max())}) and {MAX_WIDTH}")
    B, h = lengths.numel(), packed.shape[1]
    if B * width * h * packed.element_size() > 8 * max_bytes:
        raise SplitProtocolError(kind, "width", f"padding to {width} positions would blow the "
                                                "message up more than 8x")
    valid = torch.arange(width).unsqueeze(0) < lengths.long().unsqueeze(1)
    out = packed.new_zeros(B, width, h)
    out[valid] = packed
    return out, valid.long()


def _read_header(data: bytes, max_bytes: int) -> dict:
    if len(data) > max_bytes:
        raise SplitProtocolError("message", "body", f"{len(data)} bytes, over the limit of "
                                                    f"{max_bytes}")
    if len(data) < 8:
        raise SplitProtocolError("message", "body", "not a safetensors message (too short)")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(MAX_HEADER, len(data) - 8):
        raise SplitProtocolError("message", "body",
                                 f"not a safetensors message (header length {n})")
    try:
        header = json.loads(data[8:8 + n])
    except (UnicodeDecodeError, ValueError):
        raise SplitProtocolError("message", "body",
                                 "not a safetensors message (header is not JSON)") from None
    if not isinstance(header, dict):
        raise SplitProtocolError("message", "body", "not a safetensors message")
    return header


def decode(data: bytes, expect: type | tuple[type, ...], *, max_bytes: int) -> object:
    """Bytes -> a checked message of one of the ``expect`` types (SplitProtocolError else)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    allowed = expect if isinstance(expect, tuple) else (expect,)
    names = " or ".join(c.__name__ for c in allowed)
    header = _read_header(data, max_bytes)
    meta = header.pop("__metadata__", None) or {}
    kind = meta.get("message")
    cls = next((c for c in allowed if c.__name__ == kind), None)
    if cls is None:
        raise SplitProtocolError(names, "message",
                                 f"expected a {names} message, got {kind!r}")
    want = [f.name for f in fields(cls) if f.name not in _INT_FIELDS]
    if kind in _PACKED:
        want = [_PACKED[kind], "lengths"]
    if set(header) != set(want):
        raise SplitProtocolError(kind, "tensors", f"expected exactly {sorted(want)}, got "
                                                  f"{sorted(header)}")
    for name in want:
        spec = header[name]
        dtype = spec.get("dtype") if isinstance(spec, dict) else None
        if dtype not in _DTYPES[name]:
            raise SplitProtocolError(kind, name, f"dtype {dtype} is not allowed (one of "
                                                 f"{', '.join(sorted(_DTYPES[name]))})")
    kw: dict[str, object] = {}
    for f in _INT_FIELDS:
        if any(x.name == f for x in fields(cls)):
            kw[f] = _meta_int(kind, f, meta.get(f))
    try:
        tensors = load(bytes(data))
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise SplitProtocolError(kind, "body", f"damaged safetensors data ({e})") from None
    if kind in _PACKED:
        width = _meta_int(kind, "width", meta.get("width"), max_digits=9)
        key = _PACKED[kind]
        padded, mask = _unpack(kind, tensors[key], tensors["lengths"], width, max_bytes)
        kw[key] = padded
        if kind == "Activations":
            kw["mask"] = mask
    else:
        kw.update({k: tensors[k] for k in want})
    return cls(**kw)  # __post_init__: shapes, masks, finiteness


def pad_rows(rows: list[Tensor], dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """Per-row hidden states [(n_i, h)] -> right-padded (B, max n, h) zeros (in ``dtype``,
    default the first row's) and mask (B, n)."""
    n, h = max(r.shape[0] for r in rows), rows[0].shape[-1]
    hidden = torch.zeros(len(rows), n, h, dtype=dtype or rows[0].dtype)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    for i, r in enumerate(rows):
        hidden[i, :r.shape[0]] = r
        mask[i, :r.shape[0]] = 1
    return hidden, mask
