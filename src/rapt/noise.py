"""Where privacy noise comes from: the OS CSPRNG unless the caller passes a seed.

Every privacy mechanism in rapt (dχ noise, DP-SGD's Poisson sampling and Gaussian noise,
GNMax's vote noise) draws through a :class:`NoiseSource`:

* ``NoiseSource()`` (no seed): every call keys a fresh ChaCha20 keystream (RFC 8439, the
  ``cryptography`` package, i.e. OpenSSL) with 32 bytes from ``os.urandom`` (the kernel's
  CSPRNG, itself ChaCha20-based on Linux) and reads the draw's bits from it (a large draw:
  one fresh keystream per slice, filled by threads in parallel). The key is a local
  of that call and is never stored or reused, so there is still no generator state: nothing to
  checkpoint, nothing that, once seen, predicts another call's bits. A resumed run simply draws
  fresh noise. (Python cannot zero freed memory, so the key, like the noise itself, may linger
  in the process heap until overwritten; an attacker who can read that heap reads the noise.)
  Reading a keystream is ~2.5x faster than ``os.urandom`` for the same bits (benchmarks/
  bench_noise.py); its output is indistinguishable from uniform as long as ChaCha20 is a PRF.
* ``NoiseSource(seed)`` draws the same kind of bits from a seeded ``torch.Generator`` so tests
  and benchmarks can repeat a run. Such a run carries ``seeded: true`` in every artifact and
  report: whoever knows the seed knows the noise, which voids the guarantee.
  :meth:`NoiseSource.derive` gives independent, repeatable sub-streams (one per DP-SGD step), so
  a resumed seeded run continues the stream instead of replaying it.

Both paths share one set of transforms from uniform 52-bit integers, so the seeded path
exercises exactly the arithmetic the private path uses.

Uniforms: k uniform on {0, …, 2^52 − 1} maps to u = (k + ½)·2^-52. Every such u is exactly
representable in float64 (k + ½ needs 53 significant bits), so u is uniform on a grid of 2^52
points in [2^-53, 1 − 2^-53] = [1.11e-16, 1 − 1.11e-16]: never 0, never 1. (With 53-bit k the
top values of k + ½ rounded up to 2^53, so u = 1 had probability 2^-53 and the Gamma inverse
CDF returned ∞.) Consequence: Box–Muller's radius is at most sqrt(2·53·ln 2) ≈ 8.57, so a single
Box–Muller normal never exceeds 8.57 in magnitude (a missing tail mass of ~1e-17).

Gaussian mechanism noise and floating-point attacks (Mironov 2012; Jin et al. 2022): a
floating-point sampler reaches a different, sparse set of doubles for each input, so a released
``f(D) + z`` can reveal which ``f(D)`` was used. :meth:`NoiseSource.normal` by default returns
(z1 + z2 + z3 + z4) / 2 of four independent Box–Muller normals, which is N(0, 1) again; this is
opacus's ``secure_mode`` (Holohan & Braghin 2021, section 5.1 with n = 2), which raises the
cost of the known inversion attacks from ~2^53 to ~2^159 guesses. It is a mitigation, not a
proof: see docs/THREAT_MODEL.md ("Noise sampling and floating-point attacks").

Written here rather than with torch's generators because those are MT19937/Philox (their state
reveals the whole stream), and the CSPRNG add-on opacus's secure mode relied on (torchcsprng) is
no longer maintained.
"""

from __future__ import annotations

import hashlib
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy.special import gammaincinv
from torch import Tensor

__all__ = ["NoiseSource", "BITS", "U_MIN", "U_MAX", "SECURE_DRAWS", "bits_to_uniform"]

BITS = 52  # bits per uniform: k + 0.5 stays exact in float64 for every k < 2**BITS
_SCALE = 2.0 ** -BITS
U_MIN = 0.5 * _SCALE  # 2**-53, the smallest uniform drawn (k = 0)
U_MAX = 1.0 - 0.5 * _SCALE  # 1 - 2**-53, the largest (k = 2**52 - 1)
SECURE_DRAWS = 4  # Box–Muller normals summed per secure normal (opacus secure_mode: 2n, n = 2)
_ZERO_NONCE = bytes(16)  # ChaCha20 counter + nonce; a fixed nonce is safe under a one-time key


_ONE_BITS = 0x3FF0000000000000  # IEEE-754 bits of 1.0 (exponent 0, empty mantissa)


def bits_to_uniform(k: Tensor, *, inplace: bool = False) -> Tensor:
    """Integers k in [0, 2**BITS) (int64) -> float64 uniforms (k + 0.5)·2**-BITS in
    [U_MIN, U_MAX].

    k as the mantissa of 1.0 is exactly 1 + k·2^-52; subtracting 1 - 2^-53 then leaves
    (k + ½)·2^-52, which is representable, so IEEE subtraction returns it exactly. Same values as
    ``(k.double() + 0.5) * 2**-52`` at ~6x the speed (no int-to-float conversion).
    ``inplace=True`` reuses k's memory (k is then gone): a caller's own fresh draw skips a copy
    as large as the draw."""
    k = k if inplace else k.clone()
    return k.bitwise_or_(_ONE_BITS).view(torch.float64).sub_(U_MAX)


def _os_bits(n: int) -> np.ndarray:
    """n uniform integers in [0, 2**BITS) (int64) from ChaCha20 keystreams whose keys exist only
    inside this call (32 fresh bytes from os.urandom per keystream).

    The keystream is written straight into the result (``update_into``, no intermediate
    bytes). A large draw is cut into up to :data:`_KEYSTREAM_THREADS` slices, each with its own
    fresh key, filled by threads in parallel (OpenSSL runs without the GIL); the slices are
    independent keystreams, so the bits are as uniform as one stream's."""
    out = np.empty(n, dtype=np.uint64)
    raw = memoryview(out).cast("B")
    per = max(-(-n // _KEYSTREAM_THREADS), _PARALLEL_MIN_WORDS) * 8
    slices = [raw[s:s + per] for s in range(0, len(raw), per)]
    if len(slices) > 1:
        list(_keystream_pool().map(_fill_keystream, slices))
    elif slices:
        _fill_keystream(slices[0])
    out >>= np.uint64(64 - BITS)
    return out.view(np.int64)  # < 2**52 after the shift, so the sign bit is clear


_ZEROS = bytes(1 << 23)  # the plaintext of every keystream piece: 8 MiB of zeros, read-only
_PARALLEL_MIN_WORDS = 1 << 20  # below 8 MiB per slice a thread costs more than it saves
_KEYSTREAM_THREADS = max(1, min(8, os.cpu_count() or 1))


def _fill_keystream(buf: memoryview) -> None:
    """Overwrite ``buf`` (bytes) with a ChaCha20 keystream under a fresh one-time key."""
    enc = Cipher(algorithms.ChaCha20(os.urandom(32), _ZERO_NONCE), mode=None).encryptor()
    zeros = memoryview(_ZEROS)
    for s in range(0, len(buf), len(zeros)):
        m = min(len(zeros), len(buf) - s)
        enc.update_into(zeros[:m], buf[s:s + m])


_POOLS: dict[int, ThreadPoolExecutor] = {}


def _keystream_pool() -> ThreadPoolExecutor:
    """This process's keystream threads. Keyed by pid: a forked child (a service worker, a
    multiprocessing pool) inherits the parent's pool object but not its threads, and would wait
    forever on it."""
    pid = os.getpid()
    if pid not in _POOLS:
        _POOLS[pid] = ThreadPoolExecutor(_KEYSTREAM_THREADS, thread_name_prefix="rapt-noise")
    return _POOLS[pid]


def _derived_seed(seed: int, labels: tuple[str | int, ...]) -> int:
    """A 63-bit seed for the sub-stream ``labels`` of ``seed`` (SHA-256, so sub-streams of
    different labels share no structure a Mersenne-Twister seeding could relate)."""
    text = repr((int(seed), *labels)).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


class NoiseSource:
    """Privacy randomness: OS entropy (``seed=None``) or a repeatable seeded stream.

    All draws return float64 or bool tensors on ``device`` (default CPU)."""

    def __init__(self, seed: int | None = None) -> None:
        self.seeded = seed is not None
        self._seed = int(seed) if seed is not None else None
        self._gen = torch.Generator().manual_seed(self._seed) if seed is not None else None

    def __repr__(self) -> str:
        return f"NoiseSource({'seeded' if self.seeded else 'os.urandom + ChaCha20'})"

    def derive(self, *labels: str | int) -> NoiseSource:
        """The sub-stream named ``labels``: for a seeded source, a new seeded source that depends
        only on (seed, labels), not on what was drawn before (so a resumed run can continue at
        step k without replaying steps 1..k); an unseeded source returns itself, since each of
        its draws is fresh anyway."""
        if self._seed is None:
            return self
        return NoiseSource(_derived_seed(self._seed, labels))

    def _bits(self, n: int) -> Tensor:
        """n uniform integers in [0, 2**BITS) (int64, (n,), CPU)."""
        if self._gen is not None:
            return torch.randint(0, 2 ** BITS, (n,), generator=self._gen, dtype=torch.int64)
        return torch.from_numpy(_os_bits(n))

    def uniform(self, n: int, *, device: torch.device | str | None = None) -> Tensor:
        """n draws from the 2**52-point uniform grid in [U_MIN, U_MAX] ⊂ (0, 1) (float64, (n,))."""
        k = self._bits(int(n))
        # The bits travel, not the uniforms (same bytes): the exact bit arithmetic then runs on
        # the device, with the same result as on the CPU.
        return bits_to_uniform(k if device is None else k.to(device), inplace=True)

    def _box_muller(self, n: int, device: torch.device | str | None) -> Tensor:
        """n standard normals, one Box–Muller output each (float64, (n,)); |z| <= 8.57."""
        half = (n + 1) // 2
        u = self.uniform(2 * half, device=device)
        r = torch.sqrt(-2.0 * torch.log(u[:half]))
        theta = (2.0 * math.pi) * u[half:]
        return torch.cat([r * torch.cos(theta), r * torch.sin(theta)])[:n]

    def normal(self, shape: tuple[int, ...] | torch.Size, *, std: float = 1.0,
               device: torch.device | str | None = None,
               dtype: torch.dtype = torch.float64, secure: bool = True) -> Tensor:
        """N(0, std²) draws of ``shape``, computed in float64 and cast to ``dtype``.

        ``secure`` (default): each value is the sum of SECURE_DRAWS = 4 Box–Muller normals / 2,
        opacus's defence against floating-point attacks (4x the bits). ``secure=False``: one
        Box–Muller normal each, for callers that release no function of the raw value."""
        n = math.prod(shape)
        if secure:
            z = self._box_muller(SECURE_DRAWS * n, device).reshape(SECURE_DRAWS, n).sum(0)
            z = z / math.sqrt(SECURE_DRAWS)
        else:
            z = self._box_muller(n, device)
        return (z * float(std)).reshape(tuple(shape)).to(dtype)

    def gamma(self, shape_param: float, n: int, *,
              device: torch.device | str | None = None) -> Tensor:
        """n draws from Gamma(shape, scale 1) by the inverse CDF (float64, (n,)); always finite
        because u <= U_MAX < 1."""
        u = self.uniform(int(n)).numpy()
        g = torch.from_numpy(gammaincinv(float(shape_param), u))
        return g if device is None else g.to(device)

    def integers(self, high: int, n: int) -> Tensor:
        """n independent draws, each uniform on {0, ..., high − 1} exactly (int64, (n,)):
        52-bit draws at or above the largest multiple of ``high`` are drawn again, so the
        remainder carries no modulo bias."""
        high = int(high)
        if not 0 < high <= 2 ** BITS:
            raise ValueError(f"high must lie in [1, 2**{BITS}], got {high}")
        limit = (2 ** BITS // high) * high
        k = self._bits(int(n))
        while bool((bad := k >= limit).any()):
            k[bad] = self._bits(int(bad.sum()))
        return k % high

    def bernoulli(self, p: float, n: int) -> Tensor:
        """n independent Bernoulli(p) draws (bool, (n,)); Pr[True] is p to within 2**-52."""
        return self.uniform(int(n)) < float(p)
