"""SAP with ``privatize="output"`` (issue 28 item 1): dχ noise on the bottom's output states.

The noise has the dχ law (norm Gamma(width, 1/η), direction uniform), the ids stay clean, and
what crosses the wire is the noised tensor only, once per row for a frozen bottom."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from scipy import stats

from rapt.split import (
    Activations,
    SplitConfig,
    encode_texts,
    make_customer,
    setup_split,
    split_backbone,
    train_split,
    wire,
)
from rapt.split.customer import _pad
from tests._tiny import WORDS, make_bert

ETA = 4.0


def _texts(n: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    return [" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (int(k),), generator=g))
            for k in torch.randint(3, 12, (n,), generator=g)]


def _parties(tiny_tokenizer, n_rows=16, **kw):
    bb = make_bert(tiny_tokenizer)
    rows = encode_texts(bb.tokenizer, _texts(n_rows), 16)
    cfg = SplitConfig(**{"split_layer": 1, "eta": ETA, "privatize": "output", "noise_seed": 3,
                         "batch_size": 4, "epochs": 1, **kw})
    customer, provider = setup_split(bb, cfg, 2, len(rows))
    return bb, rows, customer, provider


def _clean(customer, rows, pad_id):
    ids, mask = _pad(rows, pad_id)
    with torch.no_grad():
        return customer.bottom(ids, mask), mask


def test_output_noise_has_the_dchi_law(tiny_tokenizer):
    bb, rows, customer, _ = _parties(tiny_tokenizer, n_rows=64)
    clean, mask = _clean(customer, rows, bb.tokenizer.pad_token_id)
    ids, _ = _pad(rows, bb.tokenizer.pad_token_id)
    assert torch.equal(customer.privatize(ids), ids)  # no token is touched in this mode
    valid = mask.bool()
    z = torch.cat([(customer.encode(rows).hidden - clean)[valid] for _ in range(8)]).double()
    width = clean.shape[-1]
    norms = z.norm(dim=-1).numpy()
    assert len(norms) > 2000
    gamma = stats.gamma(a=width, scale=1 / ETA)
    assert stats.kstest(norms, gamma.cdf).pvalue > 1e-3
    # the test has power: the norm law of a wrong width or a wrong η is rejected
    assert stats.kstest(norms, stats.gamma(a=width // 2, scale=1 / ETA).cdf).pvalue < 1e-6
    assert stats.kstest(norms, stats.gamma(a=width, scale=1.2 / ETA).cdf).pvalue < 1e-6
    # uniform direction: the mean unit vector has E‖m‖² = 1/n
    u = z / z.norm(dim=-1, keepdim=True)
    assert u.mean(0).norm() < 4 / len(u) ** 0.5
    assert customer.measured_p == 0.0 and customer.perturbable == int(valid.sum()) * 8


def test_the_wire_carries_only_the_noised_states_once(tiny_tokenizer):
    bb, rows, customer, provider = _parties(tiny_tokenizer)
    labels = [i % 2 for i in range(len(rows))]
    customer.load(rows, labels)
    clean, mask = _clean(customer, rows, bb.tokenizer.pad_token_id)
    rel = customer.frozen_release(0, len(rows))
    blob = wire.encode(rel)
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    assert set(header) - {"__metadata__"} == {"hidden", "lengths"}
    noised = torch.cat(rel.rows())
    clean_valid = clean[mask.bool()]
    assert noised.shape == clean_valid.shape
    # every position is displaced, and no clean state (nor its float32 bytes) is on the wire
    assert ((noised - clean_valid).norm(dim=-1) > 0.25 * clean.shape[-1] / ETA).all()
    for vec in clean_valid:
        assert vec.float().numpy().tobytes() not in blob
    ids, _ = _pad(rows, bb.tokenizer.pad_token_id)
    assert ids.numpy().astype("int64").tobytes() not in blob
    back = wire.decode(blob, type(rel), max_bytes=len(blob))
    assert torch.equal(torch.cat(back.rows()), noised)
    # training sends the same noised states (drawn once at load), never fresh ones
    sent = []
    fwd = provider.forward
    provider.forward = lambda a, **k: (sent.append(a), fwd(a, **k))[1]
    order = []
    train_split(customer, provider, observe=lambda idx, acts: order.append(idx))
    assert sent and all(isinstance(a, Activations) for a in sent)
    per_row = rel.rows()
    for idx, acts in zip(order, sent, strict=True):
        for j, i in enumerate(idx):
            assert torch.equal(acts.hidden[j, :len(rows[i])], per_row[i])


def test_unfrozen_bottom_draws_fresh_output_noise(tiny_tokenizer):
    bb, rows, customer, _ = _parties(tiny_tokenizer, unfreeze_bottom=True)
    customer.load(rows, [i % 2 for i in range(len(rows))])
    a = customer.release([0, 1, 2, 3], 0).hidden
    customer._pending = None
    b = customer.release([0, 1, 2, 3], 1).hidden
    assert not torch.equal(a, b)


def test_resume_restores_the_released_states(tiny_tokenizer):
    bb, rows, customer, _ = _parties(tiny_tokenizer)
    labels = [i % 2 for i in range(len(rows))]
    customer.load(rows, labels)
    state = customer.state_dict()
    assert state["released_hidden"] is not None
    _, _, other, _ = _parties(tiny_tokenizer, noise_seed=99)
    other.load(rows, labels)
    assert not torch.equal(other.frozen_release(0, 4).hidden,
                           customer.frozen_release(0, 4).hidden)
    other.load_state_dict(state)
    assert torch.equal(other.frozen_release(0, 16).hidden, customer.frozen_release(0, 16).hidden)
    with pytest.raises(ValueError, match="no released states"):
        other.load_state_dict({**state, "released_hidden": None})


def test_output_mode_config_is_checked(tiny_tokenizer):
    for kw, word in [(dict(privatize="state"), "privatize"),
                     (dict(privatize="output", split_layer=0, eta=1.0), "split_layer >= 1"),
                     (dict(privatize="output", split_layer=1, eta=1.0, cti=True), "cti")]:
        with pytest.raises(ValueError, match=word):
            SplitConfig(**kw)
    cfg = SplitConfig(split_layer=1, eta=2.0, privatize="output")
    assert SplitConfig.from_dict(cfg.to_dict()) == cfg
    assert "privatize" not in cfg.provider_view()  # the provider is not told
    bb = make_bert(tiny_tokenizer)
    from rapt.privacy.mechanism import Privatizer

    pz = Privatizer(bb.embeddings.detach(), 2.0)
    with pytest.raises(ValueError, match="output noise needs none"):
        make_customer(bb, split_backbone(bb, 1)[0], cfg, 2, privatizer=pz)
