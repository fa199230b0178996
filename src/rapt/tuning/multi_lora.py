"""Many LoRA adapters in one forward pass over a shared, frozen model (Punica, S-LoRA).

Row b of a batch uses adapter a_b: every targeted ``nn.Linear`` returns
``W x + s_a · B_a A_a x`` with a = a_b, the shared base output plus a per-row low-rank update
computed as two batched matmuls over the rows' gathered A (B, R, in) and B (B, out, R). The
adapters are never merged into W, so the base model stays shared and any mix of adapters can
share a pass. Adapters of different ranks are zero-padded to the largest rank R (the extra rows
of A and columns of B are zero and add nothing): one "rank family" per pass.

The update is added by forward hooks on the shared model's linears rather than by swapping in
wrapper modules: the module tree (state_dict keys, what peft and deep copies see) stays as it
is, and each hook acts only on passes of the thread that installed it, since training jobs run
their own passes through the same modules at the same time.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rapt.tuning.tuners import lora_scaling


@dataclass(frozen=True)
class LoraWeights:
    """One targeted linear's update ``scaling · B A``: A (r, in), B (out, r)."""

    A: Tensor
    B: Tensor
    scaling: float


Adapter = dict[str, LoraWeights]  # path of the targeted nn.Linear in the model -> its update

_KEY = re.compile(r"^(?P<path>.+)\.lora_(?P<part>[AB])\.(?P<name>[^.]+)\.weight$")


def adapter_from_peft_state(state: Mapping[str, Tensor], prefix: str = "", *,
                            scaling: Callable[[int], float] = lora_scaling,
                            device: torch.device | str | None = None) -> Adapter:
    """One adapter from a peft LoRA state dict: keys ``{prefix}{path}.lora_A.{name}.weight``
    and ``...lora_B...``, paths relative to the model the adapter was injected in; ``scaling(r)``
    is peft's factor for rank r (``lora_alpha / r``; rapt's LoraTuner uses no rank or alpha
    patterns). Any other key under ``prefix`` (DoRA magnitudes, LoRA biases, embedding
    adapters, full weights) is refused: this update would silently leave it out."""
    parts: dict[str, dict[str, Tensor]] = {}
    for key, t in state.items():
        if not key.startswith(prefix):
            continue
        m = _KEY.match(key[len(prefix):])
        if m is None:
            raise ValueError(f"{key!r} is not a plain LoRA A/B weight")
        parts.setdefault(m["path"], {})[m["part"]] = t
    out: Adapter = {}
    for path, ab in parts.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA weights of {path!r} lack lora_{({'A', 'B'} - set(ab)).pop()}")
        A, B = ab["A"].to(device), ab["B"].to(device)
        if A.dim() != 2 or B.dim() != 2 or B.shape[1] != A.shape[0]:
            raise ValueError(f"LoRA weights of {path!r}: A {tuple(A.shape)} and B "
                             f"{tuple(B.shape)} do not form B·A")
        out[path] = LoraWeights(A, B, float(scaling(A.shape[0])))
    if not out:
        raise ValueError(f"no LoRA weights under {prefix!r}")
    return out


def row_update(x: Tensor, A: Tensor, B: Tensor, scaling: Tensor) -> Tensor:
    """Per-row low-rank update: x (b, n, in), A (b, R, in), B (b, out, R), scaling (b,)
    -> ``scaling[i] · x[i] A[i]ᵀ B[i]ᵀ`` (b, n, out), in peft's order of operations."""
    if x.dim() != 3 or x.shape[0] != A.shape[0]:
        raise ValueError(f"per-row LoRA needs inputs (rows, positions, features) with "
                         f"{A.shape[0]} rows, got {tuple(x.shape)}")
    x = x.to(A.dtype)
    return torch.bmm(torch.bmm(x, A.transpose(1, 2)), B.transpose(1, 2)) * scaling.view(-1, 1, 1)


def stack_rows(adapters: Sequence[Adapter], index: Tensor
               ) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
    """Per targeted path, the rows' A (b, R, in), B (b, out, R) and scaling (b,) for row i
    using ``adapters[index[i]]``; ranks zero-padded to the path's largest R, and an adapter
    that does not target the path contributes a zero update."""
    out = {}
    for path in dict.fromkeys(p for a in adapters for p in a):
        have = [a[path] for a in adapters if path in a]
        R = max(w.A.shape[0] for w in have)
        ref = have[0]
        zero = LoraWeights(ref.A.new_zeros(R, ref.A.shape[1]),
                           ref.B.new_zeros(ref.B.shape[0], R), 0.0)
        ws = [a.get(path, zero) for a in adapters]
        A = torch.stack([w.A if w.A.shape[0] == R else
                         nn.functional.pad(w.A, (0, 0, 0, R - w.A.shape[0])) for w in ws])
        B = torch.stack([w.B if w.B.shape[1] == R else
                         nn.functional.pad(w.B, (0, R - w.B.shape[1])) for w in ws])
        s = torch.tensor([w.scaling for w in ws], dtype=A.dtype, device=A.device)
        idx = index.to(A.device)
        out[path] = (A[idx], B[idx], s[idx])
    return out


@contextmanager
def per_row_adapters(model: nn.Module, adapters: Sequence[Adapter],
                     index: Tensor) -> Iterator[None]:
    """Within the block, forward passes of ``model`` made by this thread over batches of
    ``len(index)`` rows add row i's update of ``adapters[index[i]]`` to every targeted linear;
    other threads' passes are untouched."""
    rows = stack_rows(adapters, index)
    me = threading.get_ident()
    handles = []

    def make_hook(A: Tensor, B: Tensor, s: Tensor) -> Callable:
        def hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
            if threading.get_ident() != me:
                return None
            return output + row_update(args[0], A, B, s).to(output.dtype)
        return hook

    try:
        for path, (A, B, s) in rows.items():
            layer = model.get_submodule(path)
            if not isinstance(layer, nn.Linear):
                raise ValueError(f"LoRA target {path!r} is a {type(layer).__name__}, not a Linear")
            if (layer.in_features, layer.out_features) != (A.shape[2], B.shape[1]):
                raise ValueError(f"LoRA weights of {path!r} ({B.shape[1]}x{A.shape[2]}) do not "
                                 f"fit its {layer.out_features}x{layer.in_features} weight")
            handles.append(layer.register_forward_hook(make_hook(A, B, s)))
        yield
    finally:
        for h in handles:
            h.remove()
