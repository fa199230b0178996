"""rapt.tuning.multi_lora: per-row LoRA updates over a shared model (zero-padded ranks, hooks that
act only in their own thread, peft state dicts read strictly)."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from rapt.tuning.multi_lora import (
    LoraWeights,
    adapter_from_peft_state,
    per_row_adapters,
    row_update,
    stack_rows,
)


def _adapter(g, r: int, d_in: int = 6, d_out: int = 5, scaling: float = 2.0):
    return {"lin": LoraWeights(torch.randn(r, d_in, generator=g),
                               torch.randn(d_out, r, generator=g), scaling)}


def test_rows_of_different_ranks_get_their_own_update():
    g = torch.Generator().manual_seed(0)
    adapters = [_adapter(g, 1, scaling=16.0), _adapter(g, 3), _adapter(g, 2, scaling=0.5)]
    index = torch.tensor([2, 0, 1, 0])
    x = torch.randn(4, 7, 6, generator=g)
    A, B, s = stack_rows(adapters, index)["lin"]
    assert A.shape == (4, 3, 6) and B.shape == (4, 5, 3)  # padded to the largest rank
    got = row_update(x, A, B, s)
    for b, a in enumerate(index.tolist()):
        w = adapters[a]["lin"]
        assert torch.allclose(got[b], (x[b] @ w.A.T @ w.B.T) * w.scaling, atol=1e-5)


def test_an_adapter_without_a_target_adds_nothing_there():
    g = torch.Generator().manual_seed(1)
    with_lin, without = _adapter(g, 2), {"other": _adapter(g, 2)["lin"]}
    A, B, s = stack_rows([with_lin, without], torch.tensor([1, 0]))["lin"]
    got = row_update(torch.randn(2, 3, 6, generator=g), A, B, s)
    assert torch.count_nonzero(got[0]) == 0 and torch.count_nonzero(got[1]) > 0


def test_hooks_act_only_in_the_installing_thread_and_are_removed():
    g = torch.Generator().manual_seed(2)
    model = nn.Sequential()
    model.add_module("lin", nn.Linear(6, 5))
    x = torch.randn(2, 3, 6, generator=g)
    base = model(x)
    adapters = [_adapter(g, 2)]
    other: list[torch.Tensor] = []
    with per_row_adapters(model, adapters, torch.tensor([0, 0])):
        mine = model(x)
        t = threading.Thread(target=lambda: other.append(model(x)))
        t.start()
        t.join()
    w = adapters[0]["lin"]
    assert torch.allclose(mine, base + (x @ w.A.T @ w.B.T) * w.scaling, atol=1e-5)
    assert torch.equal(other[0], base)  # a training thread's pass is untouched
    assert torch.equal(model(x), base) and not model.lin._forward_hooks


def test_peft_state_is_read_strictly():
    g = torch.Generator().manual_seed(3)
    A, B = torch.randn(4, 6, generator=g), torch.randn(5, 4, generator=g)
    state = {"m.enc.q.lora_A.default.weight": A, "m.enc.q.lora_B.default.weight": B,
             "head.linear.weight": torch.zeros(2, 5)}
    ad = adapter_from_peft_state(state, "m.")
    assert set(ad) == {"enc.q"} and ad["enc.q"].scaling == 16 / 4  # peft: lora_alpha / r
    with pytest.raises(ValueError, match="not a plain LoRA"):
        adapter_from_peft_state({**state, "m.enc.q.lora_magnitude_vector.default.weight": A}, "m.")
    with pytest.raises(ValueError, match="lack lora_B"):
        adapter_from_peft_state({"m.enc.q.lora_A.default.weight": A}, "m.")
    with pytest.raises(ValueError, match="do not form"):
        adapter_from_peft_state({"m.q.lora_A.default.weight": A, "m.q.lora_B.default.weight":
                                 torch.zeros(5, 3)}, "m.")
