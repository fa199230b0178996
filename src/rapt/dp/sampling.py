"""Poisson sampling of logical batches: each example joins each batch independently with rate q.

This is the sampling that the subsampled-Gaussian accountants assume; fixed-size shuffled
batches would not match the analysis. Batches may be empty.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rapt.dp.config import check_n_examples, check_sample_rate
from rapt.noise import NoiseSource


def poisson_batch(n_examples: int, sample_rate: float, noise: NoiseSource) -> torch.Tensor:
    """Indices (LongTensor, sorted, possibly empty) of one Poisson batch over ``n_examples``."""
    n = check_n_examples(n_examples)
    q = check_sample_rate(sample_rate)
    mask = noise.bernoulli(q, n)
    return mask.nonzero(as_tuple=False).squeeze(1)


def poisson_batches(
    n_examples: int, sample_rate: float, steps: int, noise: NoiseSource
) -> Iterator[torch.Tensor]:
    """``steps`` independent Poisson batches (see :func:`poisson_batch`)."""
    if int(steps) < 0:
        raise ValueError(f"steps must be ≥ 0 (got {steps})")
    for _ in range(int(steps)):
        yield poisson_batch(n_examples, sample_rate, noise)


def micro_batches(indices: torch.Tensor, physical_batch_size: int) -> list[torch.Tensor]:
    """Split a logical batch into chunks of at most ``physical_batch_size`` (none if empty)."""
    if physical_batch_size < 1:
        raise ValueError(f"physical_batch_size must be ≥ 1 (got {physical_batch_size})")
    return list(torch.split(indices, physical_batch_size)) if indices.numel() else []
