"""The contextual denoiser (issue 27): trained on (privatized -> original) pairs, it recovers
replaced tokens that nearest neighbour never can, sees only privatized ids at predict time,
and round-trips through its artifact."""

from __future__ import annotations

import json
import random

import pytest
import torch
from _tiny import WORDS

from rapt.attacks.recovery import ATTACKERS, ReconstructionInput
from rapt.channel.denoiser import Denoiser, DenoiserConfig, train_denoiser
from rapt.privacy.inversion import invert_ids
from rapt.privacy.mechanism import Privatizer, calibrate_eta, candidate_ids_from_tokenizer


def _chain_rows(tok, n: int, length: int, seed: int) -> list[list[int]]:
    """Sentences of a grammar where context fixes every token: each word is followed by its
    successor in one fixed cycle over the vocabulary, from a random start."""
    ids = [tok.convert_tokens_to_ids(w) for w in WORDS]
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        s = rng.randrange(len(ids))
        rows.append([ids[(s + k) % len(ids)] for k in range(length)])
    return rows


def _privatizer(bb, rows, p: float, seed: int) -> Privatizer:
    cand = candidate_ids_from_tokenizer(bb.tokenizer)
    flat = [t for r in rows for t in r]
    eta = calibrate_eta(bb.embeddings, p, flat, bb.special_ids, candidate_ids=cand, tol=0.02)
    return Privatizer(bb.embeddings, eta, special_ids=bb.special_ids, candidate_ids=cand,
                      seed=seed)


def _privatize(priv: Privatizer, rows) -> list[list[int]]:
    return [priv.privatize_ids(torch.tensor(r)).tolist() for r in rows]


def _recovery(clean, private, guess) -> tuple[float, float]:
    """(share of all tokens recovered, share of replaced tokens recovered)."""
    tot = rep = ok = ok_rep = 0
    for c, p, g in zip(clean, private, guess, strict=True):
        for a, b, x in zip(c, p, g, strict=True):
            tot += 1
            ok += a == x
            if a != b:
                rep += 1
                ok_rep += a == x
    return ok / tot, ok_rep / rep


@pytest.fixture()
def chain(tiny_bert):
    train = _chain_rows(tiny_bert.tokenizer, 1500, 8, seed=0)
    test = _chain_rows(tiny_bert.tokenizer, 150, 8, seed=1)
    priv = _privatizer(tiny_bert, train, 0.3, seed=0)
    return train, _privatize(priv, train), test, _privatize(priv, test)


FAST = DenoiserConfig(lr=1e-2, epochs=15, batch_size=32, max_length=16, keep_bonus=2.0, seed=0)


def test_denoiser_recovers_replaced_tokens_nearest_neighbour_cannot(tiny_bert, chain):
    train_c, train_p, test_c, test_p = chain
    log: list[dict] = []
    den = train_denoiser(tiny_bert, train_c, train_p, FAST, meta={"corpus": "chain grammar"},
                         progress=log.append)
    assert log[-1]["step"] == log[-1]["total_steps"] and "replaced_acc" in log[-1]
    nn_guess = [invert_ids(torch.tensor(p), tiny_bert.embeddings).tolist() for p in test_p]
    nn_all, nn_rep = _recovery(test_c, test_p, nn_guess)
    all_, rep = _recovery(test_c, test_p, den.guess(test_p))
    assert nn_rep == 0.0  # the same embeddings map every replaced token to itself
    chance = 1 / len(WORDS)
    assert rep > max(0.3, 10 * chance), (rep, nn_rep)
    assert all_ > nn_all + 0.1, (all_, nn_all)
    assert den.meta["corpus"] == "chain grammar" and den.meta["tokens"] == 1500 * 8


def test_denoiser_never_receives_original_ids_at_predict(tiny_bert, chain):
    train_c, train_p, test_c, test_p = chain
    den = Denoiser(tiny_bert, FAST)
    seen: list[torch.Tensor] = []
    inner = den.encoder.forward

    def spy(*args, **kwargs):
        seen.append(kwargs["input_ids"].clone())
        return inner(*args, **kwargs)

    den.encoder.forward = spy
    rows = test_p[:40] + [test_p[40][:3]]  # rows of unequal length, so batches are padded
    den.guess(rows, batch_size=16)
    got = [r[1:1 + int((r != tiny_bert.tokenizer.pad_token_id).sum()) - 2].tolist()
           for batch in seen for r in batch]
    assert sorted(got) == sorted(rows)
    originals = test_c[:40] + [test_c[40][:3]]
    assert sorted(got) != sorted(originals)  # the privatized rows do differ from the originals


def test_training_is_seeded_and_lora_trains_only_adapters_and_head(tiny_bert, chain):
    train_c, train_p, _, test_p = chain
    cfg = DenoiserConfig(lr=3e-3, epochs=1, batch_size=64, max_length=16, seed=3)
    a = train_denoiser(tiny_bert, train_c[:128], train_p[:128], cfg)
    b = train_denoiser(tiny_bert, train_c[:128], train_p[:128], cfg)
    ta, tb = a.trained_tensors(), b.trained_tensors()
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    c = train_denoiser(tiny_bert, train_c[:128], train_p[:128],
                       DenoiserConfig(lr=3e-3, epochs=1, batch_size=64, max_length=16, seed=4))
    assert not torch.equal(c.trained_tensors()["dense.weight"], ta["dense.weight"])
    lora = train_denoiser(tiny_bert, train_c[:128], train_p[:128],
                          DenoiserConfig(lr=3e-3, epochs=1, batch_size=64, max_length=16,
                                         trainable="lora", lora_r=4))
    names = set(lora.trained_tensors())
    assert names and all("lora_" in n or not n.startswith("encoder.") for n in names)
    assert any("lora_" in n for n in names)
    before = dict(tiny_bert.model.named_parameters())["embeddings.word_embeddings.weight"]
    assert torch.equal(before, tiny_bert.embeddings)  # the caller's backbone is untouched
    assert len(lora.guess(test_p[:5])) == 5


def test_save_load_round_trip(tiny_bert, chain, tmp_path):
    train_c, train_p, _, test_p = chain
    den = train_denoiser(tiny_bert, train_c[:128], train_p[:128],
                         DenoiserConfig(lr=3e-3, epochs=1, batch_size=64, max_length=16),
                         meta={"corpus": "chain grammar", "eta": [10.0, 20.0]})
    folder = den.save(tmp_path / "den")
    doc = json.loads((folder / "config.json").read_text())
    assert doc["format"] == "rapt-denoiser" and doc["meta"]["corpus"] == "chain grammar"
    assert doc["meta"]["tokens"] == 128 * 8 and doc["meta"]["eta"] == [10.0, 20.0]
    back = Denoiser.load(folder, tiny_bert)
    assert back.guess(test_p) == den.guess(test_p)
    assert back.config == den.config
    inp = ReconstructionInput(test_p, tiny_bert.embeddings, 10.0, tuple(tiny_bert.special_ids),
                              backbone=tiny_bert, options={"denoiser": str(folder)})
    assert ATTACKERS["denoiser"](inp) == den.guess(test_p)


def test_registered_attacker_trains_on_public_rows(tiny_bert, chain):
    train_c, _, test_c, test_p = chain
    priv = _privatizer(tiny_bert, train_c, 0.3, seed=0)
    inp = ReconstructionInput(test_p, tiny_bert.embeddings, priv.eta,
                              tuple(tiny_bert.special_ids), candidate_ids=priv.candidate_ids,
                              public_rows=train_c, backbone=tiny_bert, seed=5,
                              options={"denoiser_lr": "1e-2", "denoiser_epochs": "15",
                                       "denoiser_max_length": "16", "denoiser_keep_bonus": "2"})
    _, rep = _recovery(test_c, test_p, ATTACKERS["denoiser"](inp))
    assert rep > 0.3


def test_guess_keeps_special_tokens_and_long_tails(tiny_bert, chain):
    _, _, _, test_p = chain
    den = Denoiser(tiny_bert, DenoiserConfig(max_length=6, keep_bonus=0.0))
    cls, pad = tiny_bert.tokenizer.cls_token_id, tiny_bert.tokenizer.pad_token_id
    row = [cls, *test_p[0], pad]
    out = den.guess([row])[0]
    assert len(out) == len(row) and out[0] == cls and out[-1] == pad
    assert out[4:] == row[4:]  # beyond max_length - 2 tokens: as received
    assert all(t not in tiny_bert.special_ids for t in out[1:4])


def test_pairs_must_be_aligned(tiny_bert):
    with pytest.raises(ValueError, match="aligned"):
        train_denoiser(tiny_bert, [[10, 11, 12]], [[10, 11]], DenoiserConfig())


def test_change_margin_keeps_received_tokens_and_is_fitted_on_public_pairs(tiny_bert, chain):
    from rapt.channel.denoiser import fit_change_margin

    train_c, train_p, test_c, test_p = chain
    # An untrained head: plain argmax changes tokens at random, so it loses to copying.
    den = Denoiser(tiny_bert, DenoiserConfig(max_length=16, keep_bonus=0.0, seed=0))
    argmax = den.guess(test_p)
    assert argmax != test_p
    den.config.change_margin = 1e9
    assert den.guess(test_p) == test_p  # nothing beats the received token by 1e9 logits
    den.config.change_margin = 0.0
    scores = fit_change_margin(den, train_c[:100], train_p[:100], grid=(0.0, 1e9))
    assert scores[1e9] > scores[0.0] and den.config.change_margin == 1e9
    # A trained one wins by changing tokens: the fit keeps a margin that changes some.
    den = train_denoiser(tiny_bert, train_c, train_p, FAST)
    scores = fit_change_margin(den, train_c[:200], train_p[:200], grid=(0.0, 1e9))
    assert den.config.change_margin == 0.0 and scores[0.0] > scores[1e9]


def test_adapted_backbone_is_the_denoisers_encoder_and_tunes(tiny_bert, chain):
    """Remedy (c): a prompt tuned on the adapted backbone reads rows through the denoiser's
    fine-tuned encoder (not the public one); a LoRA denoiser has no adapted encoder."""
    from rapt.tuning.tune import TuneConfig, tune

    clean, priv = chain[0], chain[1]
    den = train_denoiser(tiny_bert, clean[:64], priv[:64],
                         DenoiserConfig(lr=1e-3, epochs=1, batch_size=16, max_length=16))
    adapted = den.adapted_backbone(tiny_bert)
    assert adapted.model is den.encoder and adapted.tokenizer is tiny_bert.tokenizer
    assert not torch.equal(adapted.embeddings, tiny_bert.embeddings)  # trained, tied
    labels = [r[0] % 2 for r in priv[:32]]
    cfg = TuneConfig(method="prompt", num_virtual_tokens=2, epochs=1, batch_size=8, lr=1e-2,
                     head="linear")
    tuned = tune(adapted, priv[:32], labels, 2, cfg)
    p_adapted = tuned.predict_proba(adapted, priv[:8])
    p_public = tuned.predict_proba(tiny_bert, priv[:8])
    assert p_adapted.shape == (8, 2) and not torch.allclose(p_adapted, p_public)
    lora = Denoiser(tiny_bert, DenoiserConfig(trainable="lora"))
    with pytest.raises(ValueError, match="trainable='full'"):
        lora.adapted_backbone(tiny_bert)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_denoiser_follows_a_cuda_backbone_in_training_and_load(tiny_bert, chain, tmp_path):
    train_c, train_p, _, test_p = chain
    cpu = train_denoiser(tiny_bert, train_c[:128], train_p[:128],
                         DenoiserConfig(lr=3e-3, epochs=1, batch_size=64, max_length=16))
    folder = cpu.save(tmp_path / "den")
    tiny_bert.model.cuda()
    back = Denoiser.load(folder, tiny_bert)
    assert {p.device.type for p in back.parameters()} == {"cuda"}
    a, b = back.guess(test_p), cpu.guess(test_p)
    same = sum(x == y for r, q in zip(a, b, strict=True) for x, y in zip(r, q, strict=True))
    assert same >= 0.99 * sum(len(r) for r in a)  # float32 on two devices: near-ties may flip
    gpu = train_denoiser(tiny_bert, train_c[:128], train_p[:128],
                         DenoiserConfig(lr=3e-3, epochs=1, batch_size=64, max_length=16))
    assert {p.device.type for p in gpu.parameters()} == {"cuda"}
    assert gpu.meta["steps"] == 2


def test_denoiser_lives_on_its_backbones_device(tiny_bert):
    # "meta" stands in for a GPU here: the decoder head must follow the copied encoder.
    tiny_bert.model.to("meta")
    den = Denoiser(tiny_bert, DenoiserConfig(max_length=16))
    assert {t.device.type for t in [*den.parameters(), *den.buffers()]} == {"meta"}


def test_training_goes_on_from_a_saved_denoiser(tiny_bert, chain, tmp_path):
    train_c, train_p, test_c, test_p = chain
    cfg = DenoiserConfig(lr=1e-2, epochs=3, batch_size=32, max_length=16, keep_bonus=2.0)
    first = train_denoiser(tiny_bert, train_c, train_p, cfg, meta={"corpus": "chain grammar"})
    back = Denoiser.load(first.save(tmp_path / "ckpt"), tiny_bert)
    before = {k: v.clone() for k, v in back.trained_tensors().items()}
    more = train_denoiser(tiny_bert, train_c, train_p, cfg, init=back)
    assert more is back and more.meta["corpus"] == "chain grammar"
    assert more.meta["earlier"] == [{"rows": len(train_c), "tokens": first.meta["tokens"],
                                     "steps": first.meta["steps"], "stopped": False}]
    after = more.trained_tensors()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it did train
    # Going on from the checkpoint does not start over: it is at least as good as the first
    # run on the held-out rows, and far from a fresh model's first pass.
    _, rep_first = _recovery(test_c, test_p, first.guess(test_p))
    _, rep_more = _recovery(test_c, test_p, more.guess(test_p))
    assert rep_more >= rep_first - 0.05, (rep_more, rep_first)
    with pytest.raises(ValueError, match="trainable"):
        train_denoiser(tiny_bert, train_c[:32], train_p[:32],
                       DenoiserConfig(trainable="lora", max_length=16), init=back)
