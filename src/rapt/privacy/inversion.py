"""Nearest-neighbour embedding inversion (RAPT App. A.3.2, after Qu et al. 2021).

The attacker maps each received item back to the original vocabulary by nearest-neighbour
search in an embedding space it knows (white box): ``argmin_v ‖v − v_t‖₂`` over the
vocabulary.  Two cases:

* privatized token ids (text-to-text privatization): v_t is the attacker's embedding of the
  received token, so with the same embedding matrix the attack recovers exactly the tokens
  the mechanism left unchanged, and its success rate is 1 − P;
* raw noised vectors x + z (Split-and-Privatize, where vectors are sent): v_t = x + z.

Success rate = fraction of non-special positions recovered; empirical privacy = 1 − success.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rapt.privacy.nn_search import NNIndex, SearchMode, build_index

__all__ = ["InversionResult", "inversion_attack", "invert_ids", "invert_vectors"]


@dataclass
class InversionResult:
    """Outcome of the attack on n_tokens non-special positions."""

    success_rate: float
    empirical_privacy: float
    n_tokens: int
    recovered: Tensor  # (same shape as the originals) recovered token ids

    def as_dict(self) -> dict:
        return {"success_rate": self.success_rate, "empirical_privacy": self.empirical_privacy,
                "n_tokens": self.n_tokens}


def _index(embeddings: Tensor, candidate_ids: Tensor | None, mode: SearchMode,
           index: NNIndex | None) -> NNIndex:
    if index is not None:
        return index
    vecs = embeddings if candidate_ids is None else embeddings[candidate_ids]
    return build_index(vecs.detach().float(), mode)


def invert_vectors(vectors: Tensor, embeddings: Tensor, *, candidate_ids: Tensor | None = None,
                   mode: SearchMode = "exact", index: NNIndex | None = None) -> Tensor:
    """Nearest vocabulary id for each vector: (..., d) -> LongTensor (...)."""
    d = embeddings.shape[1]
    if vectors.shape[-1] != d:
        raise ValueError(f"vectors have dimension {vectors.shape[-1]}, embeddings {d}")
    idx = _index(embeddings, candidate_ids, mode, index)
    found = idx.search(vectors.reshape(-1, d)).cpu()
    if candidate_ids is not None:
        found = torch.as_tensor(candidate_ids).cpu()[found]
    return found.reshape(vectors.shape[:-1])


def invert_ids(private_ids: Tensor, embeddings: Tensor, *, candidate_ids: Tensor | None = None,
               mode: SearchMode = "exact", index: NNIndex | None = None,
               private_embeddings: Tensor | None = None) -> Tensor:
    """Nearest original-vocabulary id of each privatized token's embedding.

    ``private_embeddings`` is the matrix the privatized ids index (default ``embeddings``;
    pass another one when the user privatized with a different embedding model over the same
    tokenizer)."""
    ids = torch.as_tensor(private_ids, dtype=torch.long).cpu()
    table = embeddings if private_embeddings is None else private_embeddings
    # A token always inverts to the same answer: search each distinct received token once.
    uniq, inverse = ids.unique(return_inverse=True)
    found = invert_vectors(table.detach().float()[uniq.to(table.device)], embeddings,
                           candidate_ids=candidate_ids, mode=mode, index=index)
    return found[inverse]


def inversion_attack(original_ids: Tensor, embeddings: Tensor, *,
                     private_ids: Tensor | None = None, noised: Tensor | None = None,
                     special_ids: Sequence[int] = (), candidate_ids: Tensor | None = None,
                     mode: SearchMode = "exact", index: NNIndex | None = None,
                     private_embeddings: Tensor | None = None) -> InversionResult:
    """Run the attack on privatized ids *or* noised vectors (exactly one) and score it.

    ``original_ids`` (any shape) are the true tokens; special-token positions are not counted.
    """
    if (private_ids is None) == (noised is None):
        raise ValueError("pass exactly one of private_ids or noised")
    orig = torch.as_tensor(original_ids, dtype=torch.long).cpu()
    if private_ids is not None:
        if tuple(private_ids.shape) != tuple(orig.shape):
            raise ValueError(f"private_ids shape {tuple(private_ids.shape)} != original ids "
                             f"shape {tuple(orig.shape)}")
        rec = invert_ids(private_ids, embeddings, candidate_ids=candidate_ids, mode=mode,
                         index=index, private_embeddings=private_embeddings)
    else:
        assert noised is not None
        if tuple(noised.shape[:-1]) != tuple(orig.shape):
            raise ValueError(f"noised shape {tuple(noised.shape)} does not match original ids "
                             f"shape {tuple(orig.shape)} + (d,)")
        rec = invert_vectors(noised, embeddings, candidate_ids=candidate_ids, mode=mode,
                             index=index)
    mask = ~torch.isin(orig, torch.tensor(list(special_ids), dtype=torch.long))
    n = int(mask.sum())
    success = float((rec[mask] == orig[mask]).sum()) / n if n else 0.0
    return InversionResult(success, 1.0 - success, n, rec)
