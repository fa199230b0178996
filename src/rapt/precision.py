"""Numeric precision of the backbone's forward passes: fp32, or bfloat16 autocast.

``TuneConfig.precision`` (and ``--precision``) picks it: "fp32" (the default), "bf16"
(``torch.autocast`` to bfloat16 around the backbone) or "auto": bf16 where it was measured
faster at equal accuracy, an x86 CPU with native bf16 (AVX512-BF16 or AMX; 1.8-2.7x,
benchmarks/results/precision.md), and fp32 everywhere else. That includes CUDA GPUs, although
they compute bf16 natively: on an H100, MiniLM tuning at batch 32 ran 2.1-4.7x *slower* under
bf16 autocast than in fp32 (benchmarks/results/gpu_tune.md; a model this small is bound by
per-op launch and dispatch costs, which autocast adds to). Ask for "bf16" explicitly where a
larger model makes the GPU compute-bound.

Only the backbone's pass runs in reduced precision. Its hidden states are cast back to float32
before the task head, so heads, losses, softmax, the DP engine's per-example gradients,
clipping and noise, and the privatization mechanism all stay in float32 (the gradients reaching
the fp32 parameters are fp32: autocast casts copies inside the graph, never the parameters).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch

from rapt.config import PRECISIONS

Resolved = Literal["fp32", "bf16"]
_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`rapt.config.PRECISIONS`, else ValueError."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (got {precision!r})")
    return precision


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX): torch's own probe,
    else the flags of /proc/cpuinfo (Linux), else False."""
    probes = [getattr(torch.cpu, n, None)
              for n in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if all(callable(p) for p in probes):
        return any(bool(p()) for p in probes)  # type: ignore[misc]
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags.split() for f in _CPU_FLAGS)


def resolve_precision(precision: str, device: torch.device | str) -> Resolved:
    """"fp32" or "bf16": ``precision`` with "auto" decided for ``device`` (bf16 on a CPU with
    native bf16 only: see the module docstring for why not on CUDA)."""
    if check_precision(precision) == "auto":
        on_cpu = torch.device(device).type == "cpu"
        return "bf16" if on_cpu and cpu_has_native_bf16() else "fp32"
    return precision  # type: ignore[return-value]


@contextlib.contextmanager
def autocast(precision: str, device: torch.device | str) -> Iterator[Resolved]:
    """Run the block under bfloat16 autocast on ``device`` when ``precision`` resolves to
    bf16, unchanged otherwise; yields the resolved precision."""
    resolved = resolve_precision(precision, device)
    if resolved == "fp32":
        yield resolved
        return
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
        yield resolved


def device_of(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (CPU for a module without any)."""
    p = next(iter(module.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


__all__ = ["autocast", "check_precision", "cpu_has_native_bf16", "device_of",
           "resolve_precision"]
