"""Task heads: a linear classifier on pooled encoder states, a verbalizer over a causal LM head.

Both take the tuner's hidden states ``(B, n, h)`` (aligned with the input positions) and a
``task_mask`` ``(B, n)`` that is 1 on the positions the task may read: the real input, not
padding and not the RAPT plain tokens (the paper's G_{m:m+n}).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

Pooling = Literal["mean", "cls", "last"]


def pool(hidden: Tensor, task_mask: Tensor, pooling: Pooling) -> Tensor:
    """(B, n, h) -> (B, h). ``mean`` over task positions, ``cls`` = position 0 (encoders: [CLS]),
    ``last`` = the last task position (causal LMs: the state that predicts the next token)."""
    if pooling == "mean":
        m = task_mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        idx = last_positions(task_mask)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]
    raise ValueError(f"unknown pooling {pooling!r}")


def last_positions(mask: Tensor) -> Tensor:
    """Index of the last 1 in each row of ``mask`` (B, n) -> (B,); right padding assumed."""
    n = mask.shape[1]
    ar = torch.arange(n, device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), ar, torch.full_like(ar, -1)).amax(1).clamp_min(0)


class ClassificationHead(nn.Module):
    """Linear classifier on pooled states. Mean pooling is the default because MiniLM
    (all-MiniLM-L6-v2) was trained as a mean-pooling sentence encoder; its [CLS] state carries
    little sentence-level information."""

    def __init__(self, hidden_size: int, num_labels: int, pooling: Pooling = "mean",
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.pooling = pooling
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(hidden_size, num_labels)

    def forward(self, hidden: Tensor, task_mask: Tensor) -> Tensor:
        """-> logits (B, C)."""
        return self.linear(self.dropout(pool(hidden, task_mask, self.pooling)))


class Verbalizer(nn.Module):
    """Label words scored by the (frozen) LM head at the last input position.

    ``label_token_ids[c]`` is the first token of label word c (with a leading space, as it
    would follow the input). The LM head is borrowed, not registered, so it is not saved.
    """

    def __init__(self, lm_head: nn.Module, label_token_ids: list[int]) -> None:
        super().__init__()
        if len(set(label_token_ids)) != len(label_token_ids):
            raise ValueError(f"label words share a first token: {label_token_ids}; "
                             "give distinct label words")
        self._lm_head = [lm_head]
        self.register_buffer("label_token_ids", torch.tensor(label_token_ids, dtype=torch.long),
                             persistent=False)

    def forward(self, hidden: Tensor, task_mask: Tensor) -> Tensor:
        """-> logits (B, C): the LM logits of the label words' first tokens."""
        last = pool(hidden, task_mask, "last")
        head = self._lm_head[0]
        if isinstance(head, nn.Linear):
            # Only C rows of the (V, h) output matrix are needed: skip the full-vocabulary matmul.
            w = head.weight[self.label_token_ids]
            b = head.bias[self.label_token_ids] if head.bias is not None else None
            return nn.functional.linear(last, w, b)
        return head(last)[:, self.label_token_ids]


def label_token_ids(tokenizer, label_words: list[str]) -> list[int]:
    """First token id of " word" for each label word."""
    out = []
    for w in label_words:
        ids = tokenizer(" " + w.strip(), add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"label word {w!r} tokenizes to nothing")
        out.append(int(ids[0]))
    return out
