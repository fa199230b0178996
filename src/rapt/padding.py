"""Row length padding to a bucket (client option), and its removal at the service's door.

dχ-privatization replaces tokens one for one, so a row's length travels unchanged; padding
every row up to a multiple of ``bucket`` with the pad token makes the bodies' sizes, and the
row lengths seen on the wire, coarser. The service checks the rows as sent (pad tokens count
toward its length limits), then strips the trailing pad tokens before anything else (the
attention mask then hides nothing that was real), so predictions and training are the same as
without padding. The provider therefore still learns each row's true
length: padding hides lengths from whoever sees only the traffic, not from the provider
(docs/THREAT_MODEL.md).

Only a *dedicated* pad token can do this: one that is not also a token a row may end with
(decoder tokenizers often set pad = eos), else stripping would eat real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["dedicated_pad_id", "pad_to_bucket", "strip_padding"]


def dedicated_pad_id(tokenizer: Any) -> int | None:
    """The tokenizer's pad id when it is no other special token a row can hold (bos, eos,
    cls, sep, unk, mask), else None."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        return None
    others = {getattr(tokenizer, f"{n}_token_id", None)
              for n in ("bos", "eos", "cls", "sep", "unk", "mask")}
    return None if pad in others else int(pad)


def pad_to_bucket(rows: Sequence[Sequence[int]], pad_id: int, bucket: int) -> list[list[int]]:
    """Right-pad each row with ``pad_id`` to the next multiple of ``bucket`` tokens."""
    if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 1:
        raise ValueError(f"bucket must be an integer >= 1, got {bucket!r}")
    return [list(r) + [pad_id] * (-len(r) % bucket) for r in rows]


def strip_padding(rows: Sequence[Sequence[int]], pad_id: int | None) -> list[list[int]]:
    """Rows without their trailing ``pad_id`` tokens (the first token always stays, so no row
    becomes empty); ``pad_id`` None (no dedicated pad token): the rows as they are."""
    if pad_id is None:
        return [list(r) for r in rows]
    out = []
    for r in rows:
        n = len(r)
        while n > 1 and r[n - 1] == pad_id:
            n -= 1
        out.append(list(r[:n]))
    return out
