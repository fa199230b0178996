"""Throughput of rapt.noise against torch.randn, with a KS check of each sampler.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_noise [--n 4000000] [--repeats 3]

Prints normals/s (best of ``--repeats``) for: ``torch.randn`` (float64, Philox/MT, not a
privacy source), ``NoiseSource().normal`` (OS entropy, the DP-SGD / GNMax mechanism noise),
``NoiseSource().normal(secure=False)`` (one Box–Muller draw per output) and the seeded path, and
the KS p-value of a 200k sample of each against N(0, 1).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from scipy import stats

from rapt.noise import NoiseSource


def _rate(fn: Callable[[int], torch.Tensor], n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return n / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4_000_000, help="normals per timed call")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os_src, seeded = NoiseSource(), NoiseSource(0)
    samplers: dict[str, Callable[[int], torch.Tensor]] = {
        "torch.randn (float64, not private)": lambda n: torch.randn(n, dtype=torch.float64),
        "NoiseSource().normal (OS entropy)": lambda n: os_src.normal((n,)),
        "NoiseSource(seed).normal (seeded)": lambda n: seeded.normal((n,)),
    }
    try:  # the one-draw variant exists only once the sum-of-draws sampler does
        os_src.normal((2,), secure=False)
        samplers["NoiseSource().normal(secure=False)"] = (
            lambda n: os_src.normal((n,), secure=False))
    except TypeError:
        pass
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, n = {args.n:,}")
    for name, fn in samplers.items():
        rate = _rate(fn, args.n, args.repeats)
        p = stats.kstest(fn(200_000).numpy(), "norm").pvalue
        print(f"{name:40s} {rate / 1e6:7.1f} M normals/s   KS p = {p:.3f}")


if __name__ == "__main__":
    main()
