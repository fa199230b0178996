"""Embedding inversion on split-learning releases (SAP §5.1, "EIA"): white-box attacker with
the *initial* bottom model, token accuracy = attack success, empirical privacy = 1 − accuracy.

* Bottom = embedding layer only (n = 0): the release is position-wise, so each released vector
  is matched with the embedding-layer output of every vocabulary token at that position
  (:func:`invert_embedding_layer`; for Llama-style bottoms positions do not enter, for
  BERT-style ones position and token-type embeddings and the LayerNorm do). This is the
  nearest-neighbour attack of :mod:`rapt.privacy.inversion` through the embedding layer.
* Deeper bottoms (n >= 1): the optimisation attack of Song & Raghunathan (CCS 2020, §4.2,
  white box): each position's token is relaxed to a word-selection vector, softmax(z) over
  candidate tokens, whose mixture of word embeddings goes through the bottom; z is optimised
  with Adam so the bottom's output matches the observed release (squared error over valid
  positions); the recovered token is the argmax (:func:`invert_by_optimization`).

CPU budget: the softmax runs over ``k`` candidates per position rather than the whole
vocabulary. They start as the k tokens whose embedding-layer output is most similar (cosine)
to the observed vector at that position, and ``refresh`` times during the optimisation the
weaker half is replaced by the tokens with the largest first-order gain over the *whole*
vocabulary (the gradient of the matching loss w.r.t. the mixed word vector, dotted with every
word embedding, HotFlip style). A true token never among the candidates cannot be recovered, so
:class:`SplitInversionResult` reports ``candidate_recall``; ``k=None`` optimises over the full
vocabulary (the paper-profile setting, for a GPU).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

__all__ = ["SplitInversionResult", "candidate_hits", "invert_by_optimization",
           "invert_embedding_layer", "score_inversion", "WhiteBoxBottom"]


class WhiteBoxBottom(Protocol):
    """What the attack needs of the bottom model it copied (``rapt.split.model.Bottom`` is one).

    A protocol, not an import of ``Bottom``: attacks sit below the method packages, so any model
    with these members can be attacked without the attack depending on ``rapt.split``."""

    style: str  # "bert" (positions enter the embedding layer) or "llama"

    @property
    def num_blocks(self) -> int: ...

    @property
    def word_embeddings(self) -> nn.Embedding: ...

    def token_table(self, position: int, ids: Tensor | None = None) -> Tensor: ...

    def from_word_embeddings(self, x: Tensor, mask: Tensor) -> Tensor: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...


@dataclass
class SplitInversionResult:
    """Token accuracy over non-special valid positions; ``candidate_recall`` = fraction of those
    positions whose true token was ever among the attack's candidates (1.0 for n = 0)."""

    success_rate: float
    empirical_privacy: float
    n_tokens: int
    candidate_recall: float = 1.0

    def as_dict(self) -> dict:
        return asdict(self)


def score_inversion(recovered: Tensor, original: Tensor, mask: Tensor,
                    special_ids: Sequence[int], seen: Tensor | None = None
                    ) -> SplitInversionResult:
    """Success over positions with mask 1 whose original token is not special."""
    keep = mask.bool() & ~torch.isin(original, torch.tensor(list(special_ids), dtype=torch.long))
    n = int(keep.sum())
    acc = int((recovered[keep] == original[keep]).sum()) / n if n else 0.0
    recall = int(seen[keep].sum()) / n if (seen is not None and n) else 1.0
    return SplitInversionResult(acc, 1.0 - acc, n, recall)


def _vocab(bottom: WhiteBoxBottom, candidate_ids: Tensor | None) -> Tensor:
    V = bottom.word_embeddings.weight.shape[0]
    # sorted: the HotFlip refresh looks kept ids up with searchsorted
    return torch.arange(V) if candidate_ids is None else \
        torch.as_tensor(candidate_ids).long().unique()


@torch.no_grad()
def invert_embedding_layer(bottom: WhiteBoxBottom, hidden: Tensor, mask: Tensor, *,
                           candidate_ids: Tensor | None = None) -> Tensor:
    """Nearest vocabulary token for each released vector of an n = 0 bottom.

    hidden (B, L, h), mask (B, L) -> recovered ids (B, L) (-1 where mask is 0)."""
    if bottom.num_blocks:
        raise ValueError("invert_embedding_layer is for a bottom without blocks; use "
                         "invert_by_optimization")
    vocab = _vocab(bottom, candidate_ids)
    B, L, _ = hidden.shape
    out = torch.full((B, L), -1, dtype=torch.long)
    table = None
    for j in range(L):
        rows = mask[:, j].bool()
        if not rows.any():
            continue
        if table is None or bottom.style == "bert":  # positions only matter for BERT-style
            table = bottom.token_table(j, vocab).float()
        d = torch.cdist(hidden[rows, j].float(), table)
        out[rows, j] = vocab[d.argmin(1)]
    return out


def _initial_candidates(bottom: WhiteBoxBottom, target: Tensor, mask: Tensor, vocab: Tensor,
                        k: int) -> Tensor:
    """(B, L, k) vocabulary ids most cosine-similar to the observed vectors."""
    B, L, _ = target.shape
    cand = torch.zeros(B, L, k, dtype=torch.long)
    t = torch.nn.functional.normalize(target.float(), dim=-1)
    table = None
    with torch.no_grad():
        for j in range(L):
            if table is None or bottom.style == "bert":
                table = torch.nn.functional.normalize(bottom.token_table(j, vocab).float(), dim=-1)
            cand[:, j] = vocab[(t[:, j] @ table.T).topk(k, dim=-1).indices]
    return cand


def invert_by_optimization(bottom: WhiteBoxBottom, hidden: Tensor, mask: Tensor, *,
                           known: Tensor | None = None, candidate_ids: Tensor | None = None,
                           k: int | None = 64, steps: int = 150, lr: float = 0.1,
                           refresh: int = 2, batch_size: int = 32,
                           seed: int = 0) -> tuple[Tensor, Tensor | None]:
    """Song & Raghunathan's relaxed inversion through ``bottom`` (the attacker's white-box copy).

    hidden (B, L, h) released states, mask (B, L); ``known`` (B, L) ids the attacker knows from
    the public row format (special tokens; -1 elsewhere). Returns (recovered ids (B, L) with -1
    at padding, every candidate id the attack held per position (B, L, K') or None for the
    full vocabulary); ``candidate_hits(original, candidates)`` gives the ``seen`` mask for
    :func:`score_inversion`."""
    vocab = _vocab(bottom, candidate_ids)
    W = bottom.word_embeddings.weight.detach().float()
    was = [p.requires_grad for p in bottom.parameters()]
    for p in bottom.parameters():
        p.requires_grad_(False)
    B, L, _ = hidden.shape
    known = torch.full((B, L), -1, dtype=torch.long) if known is None else known.long()
    rec = torch.full((B, L), -1, dtype=torch.long)
    ever: list[Tensor | None] = []
    g = torch.Generator().manual_seed(seed)
    try:
        for s in range(0, B, batch_size):
            sl = slice(s, s + batch_size)
            r, cands = _invert_chunk(bottom, hidden[sl].float(), mask[sl].long(), known[sl], W,
                                     vocab, k, steps, lr, refresh, g)
            rec[sl] = r
            ever.append(cands)
    finally:
        for p, w in zip(bottom.parameters(), was, strict=True):
            p.requires_grad_(w)
    if any(c is None for c in ever):
        return rec, None
    width = max(c.shape[-1] for c in ever)
    padded = [torch.nn.functional.pad(c, (0, width - c.shape[-1]), value=-1) for c in ever]
    return rec, torch.cat(padded)


def candidate_hits(original: Tensor, candidates: Tensor) -> Tensor:
    """(B, L) bool: was the original token among the candidates (B, L, K) the attack held."""
    return (candidates == original.unsqueeze(-1)).any(-1)


def _invert_chunk(bottom, target, mask, known, W, vocab, k, steps, lr, refresh, g):
    B, L, _ = target.shape
    full = k is None or k >= len(vocab)
    if full:
        cand = vocab.view(1, 1, -1).expand(B, L, -1)
    else:
        cand = _initial_candidates(bottom, target, mask, vocab, k)
    held = [cand]
    fixed = known >= 0
    m = mask.unsqueeze(-1).float()
    denom = m.sum().clamp_min(1.0) * target.shape[-1]
    # small random logits break the ties between equal-score candidates
    z = (0.01 * torch.randn(cand.shape, generator=g)).requires_grad_(True)
    phases = refresh + 1 if not full else 1
    per = max(1, steps // phases)
    for phase in range(phases):
        opt = torch.optim.Adam([z], lr=lr)
        emb = W[cand]  # (B, L, K, h) (full: broadcast view)
        for _ in range(per):
            x = torch.einsum("blk,blkh->blh", z.softmax(-1), emb) if not full else \
                z.softmax(-1) @ W[vocab]
            x = torch.where(fixed.unsqueeze(-1), W[known.clamp_min(0)], x)
            loss = (((bottom.from_word_embeddings(x, mask) - target) ** 2) * m).sum() / denom
            opt.zero_grad()
            loss.backward()
            opt.step()
        if phase == phases - 1:
            break
        # HotFlip refresh: keep the stronger half, bring in the best first-order newcomers.
        with torch.no_grad():
            p = z.softmax(-1)
            x = torch.einsum("blk,blkh->blh", p, emb)
        x = torch.where(fixed.unsqueeze(-1), W[known.clamp_min(0)], x).requires_grad_(True)
        loss = (((bottom.from_word_embeddings(x, mask) - target) ** 2) * m).sum() / denom
        (grad,) = torch.autograd.grad(loss, x)
        with torch.no_grad():
            gain = -(grad @ W[vocab].T)  # (B, L, |vocab|): first-order loss decrease
            half = cand.shape[-1] // 2
            keep_idx = z.topk(cand.shape[-1] - half, dim=-1).indices
            keep = cand.gather(-1, keep_idx)
            gain.scatter_(-1, torch.searchsorted(vocab, keep.clamp_min(0)).clamp_max(
                len(vocab) - 1), float("-inf"))  # no duplicates of kept tokens
            new = vocab[gain.topk(half, dim=-1).indices]
            cand = torch.cat([keep, new], -1)
            zk = z.gather(-1, keep_idx)
            z = torch.cat([zk, zk.min(-1, keepdim=True).values.expand(-1, -1, half)], -1)
            z = z.detach().requires_grad_(True)
        held.append(new)
    best = z.detach().argmax(-1, keepdim=True)
    rec = cand.gather(-1, best).squeeze(-1) if not full else vocab[best.squeeze(-1)]
    rec = torch.where(fixed, known, rec)
    rec = torch.where(mask.bool(), rec, torch.full_like(rec, -1))
    return rec, (None if full else torch.cat(held, -1))
