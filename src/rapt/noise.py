"""Where privacy noise comes from: the OS CSPRNG unless the caller passes a seed.

Every privacy mechanism in rapt (dχ noise, DP-SGD's Poisson sampling and Gaussian noise,
GNMax's vote noise) draws through a :class:`NoiseSource`:

* ``NoiseSource()`` (no seed) reads fresh bits from ``os.urandom`` (the kernel's CSPRNG) for every
  draw. There is no generator state: nothing to checkpoint, nothing that, once seen, predicts
  the rest of the stream. A resumed run simply draws fresh noise.
* ``NoiseSource(seed)`` draws the same bits from a seeded ``torch.Generator`` so tests and
  benchmarks can repeat a run. Such a run carries ``seeded: true`` in every artifact and report:
  whoever knows the seed knows the noise, which voids the guarantee.

Both paths share one set of transforms from uniform 53-bit integers, so the seeded path
exercises exactly the arithmetic the private path uses. Written here by hand because torch's
generators are MT19937/Philox (their state reveals the whole stream) and the CSPRNG add-on
opacus's secure mode relied on (torchcsprng) is no longer maintained.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch
from scipy.special import gammaincinv
from torch import Tensor

__all__ = ["NoiseSource"]

_MANTISSA = 53
_SCALE = 2.0 ** -_MANTISSA


class NoiseSource:
    """Privacy randomness: OS entropy (``seed=None``) or a repeatable seeded stream.

    All draws return float64 or bool tensors on ``device`` (default CPU)."""

    def __init__(self, seed: int | None = None) -> None:
        self.seeded = seed is not None
        self._gen = torch.Generator().manual_seed(int(seed)) if seed is not None else None

    def __repr__(self) -> str:
        return f"NoiseSource({'seeded' if self.seeded else 'os.urandom'})"

    def _bits(self, n: int) -> Tensor:
        """n uniform integers in [0, 2**53) (int64, CPU)."""
        if self._gen is not None:
            return torch.randint(0, 2 ** _MANTISSA, (n,), generator=self._gen, dtype=torch.int64)
        raw = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(64 - _MANTISSA)
        return torch.from_numpy(raw.astype(np.int64))

    def uniform(self, n: int, *, device: torch.device | str | None = None) -> Tensor:
        """n draws from U(0, 1), open at both ends (float64, (n,))."""
        u = (self._bits(int(n)).to(torch.float64) + 0.5) * _SCALE
        return u if device is None else u.to(device)

    def normal(self, shape: tuple[int, ...] | torch.Size, *, std: float = 1.0,
               device: torch.device | str | None = None,
               dtype: torch.dtype = torch.float64) -> Tensor:
        """N(0, std²) draws of ``shape`` (Box–Muller on open uniforms, computed in float64)."""
        n = math.prod(shape)
        half = (n + 1) // 2
        u = self.uniform(2 * half, device=device)
        r = torch.sqrt(-2.0 * torch.log(u[:half]))
        theta = (2.0 * math.pi) * u[half:]
        z = torch.cat([r * torch.cos(theta), r * torch.sin(theta)])[:n]
        return (z * float(std)).reshape(tuple(shape)).to(dtype)

    def gamma(self, shape_param: float, n: int, *,
              device: torch.device | str | None = None) -> Tensor:
        """n draws from Gamma(shape, scale 1) by the inverse CDF (float64, (n,))."""
        u = self.uniform(int(n)).numpy()
        g = torch.from_numpy(gammaincinv(float(shape_param), u))
        return g if device is None else g.to(device)

    def bernoulli(self, p: float, n: int) -> Tensor:
        """n independent Bernoulli(p) draws (bool, (n,))."""
        return self.uniform(int(n)) < float(p)
