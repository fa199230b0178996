"""Split training is a SplitStep in the one training loop: SAP's schedule, and the customer's
update made only once the provider has applied its half of the step."""

from __future__ import annotations

import pytest
import torch
from _tiny import WORDS

from rapt.split import (
    OutputGrad,
    SplitConfig,
    SplitProtocolError,
    encode_texts,
    setup_split,
    train_split,
)
from rapt.split.provider import split_scheduler

TEXTS = [" ".join(WORDS[i:i + 5]) for i in range(0, 40, 5)]  # 8 rows of 5 words
LABELS = [1, 0, 1, 0, 1, 0, 1, 0]


def test_split_schedule_warms_up_then_decays_to_zero():
    """SAP §5.1 (AdamW, linear): 10 steps with warmup_ratio 0.3 warm up over int(3.0) = 3
    steps by (s + 1) / 4, then decay by (10 - s) / 7."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = split_scheduler(opt, SplitConfig(warmup_ratio=0.3), 10)
    lrs = []
    for _ in range(11):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    want = [1 / 4, 2 / 4, 3 / 4] + [(10 - s) / 7 for s in range(3, 11)]
    assert lrs == pytest.approx(want, abs=1e-12)


def test_customer_and_provider_follow_one_schedule(tiny_bert):
    bb = tiny_bert
    rows = encode_texts(bb.tokenizer, TEXTS, 16)
    cfg = SplitConfig(split_layer=1, unfreeze_bottom=True, epochs=2, batch_size=4, lr=1e-3,
                      head_lr=1e-2, bottom_lr=1e-4, warmup_ratio=0.5)
    customer, provider = setup_split(bb, cfg, 2, len(rows))
    customer.load(rows, LABELS)
    seen = []
    hist = train_split(customer, provider, progress=lambda r: seen.append(
        (r["lr"], *[g["lr"] for g in customer.optimizer.param_groups],
         provider.scheduler.get_last_lr()[0])))
    assert [h["step"] for h in hist] == [1, 2, 3, 4] and provider.step == 4
    factors = [2 / 3, 2 / 2, 1 / 2, 0 / 2]  # after steps 1..4 of 4: (s+1)/3, then (4-s)/2
    for (lr, head, bottom, top), f in zip(seen, factors, strict=True):
        assert lr == head == pytest.approx(1e-2 * f)
        assert bottom == pytest.approx(1e-4 * f) and top == pytest.approx(1e-3 * f)


@pytest.mark.parametrize("unfreeze", [False, True])
def test_a_step_the_provider_refused_leaves_the_customer_unchanged(tiny_bert, unfreeze):
    """The provider refuses the ∂l/∂g of one step (nothing applied there); the customer has
    not updated its head or bottom either, so the run, retried, ends where an uninterrupted
    one does."""
    bb = tiny_bert
    rows = encode_texts(bb.tokenizer, TEXTS, 16)
    cfg = SplitConfig(split_layer=1, unfreeze_bottom=unfreeze, epochs=2, batch_size=3,
                      lr=1e-2, warmup_ratio=0.0)

    def parties():
        c, p = setup_split(bb, cfg, 2, len(rows))
        c.load(rows, LABELS)
        return c, p

    c_a, p_a = parties()
    train_split(c_a, p_a)
    c_b, p_b = parties()
    backward = p_b.backward

    def refuse_step_2(msg: OutputGrad):
        if msg.step == 2 and not refused:
            refused.append(msg.step)
            raise SplitProtocolError("OutputGrad", "grad", "refused for the test")
        return backward(msg)

    refused: list[int] = []
    p_b.backward = refuse_step_2
    head = [p.detach().clone() for p in c_b.head.parameters()]
    with pytest.raises(SplitProtocolError, match="refused for the test"):
        train_split(c_b, p_b, should_stop=lambda: False)
    assert p_b.step == 2
    assert not all(torch.equal(a, b)  # the head did train in the two steps before
                   for a, b in zip(head, c_b.head.parameters(), strict=True))
    p_b.discard(rewind=True)
    train_split(c_b, p_b)
    assert p_b.step == p_a.step == 6
    for a, b in zip(c_a.head.parameters(), c_b.head.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(c_a.bottom.parameters(), c_b.bottom.parameters(), strict=True):
        assert torch.equal(a, b)
    for (k, a), b in zip(p_a.trainable_state().items(), p_b.trainable_state().values(),
                         strict=True):
        assert torch.equal(a, b), k
