"""The channel adapter (issue 27, remedy (b)): LoRA distilled so that the backbone reads
privatized rows as it reads the clean ones; trained on public pairs only, merged into a private
copy, never fed original ids at tune or predict time."""

from __future__ import annotations

import json
import random

import pytest
import torch
from _tiny import WORDS

from rapt.artifacts import ArtifactError
from rapt.channel.adapter import (
    ChannelAdapter,
    ChannelAdapterConfig,
    distillation_loss,
    train_channel_adapter,
)
from rapt.privacy.mechanism import Privatizer, calibrate_eta, candidate_ids_from_tokenizer

FAST = ChannelAdapterConfig(lora_r=8, lr=1e-2, epochs=10, batch_size=32, max_length=16, seed=0)


def _rows(tok, n: int, seed: int) -> list[list[int]]:
    """Sentences of a grammar where context fixes every token (each word is followed by its
    successor in one cycle over the vocabulary), of 5 to 10 tokens."""
    ids = [tok.convert_tokens_to_ids(w) for w in WORDS]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = rng.randrange(len(ids))
        out.append([ids[(s + k) % len(ids)] for k in range(rng.randint(5, 10))])
    return out


def _privatize(bb, rows, seed: int) -> list[list[int]]:
    cand = candidate_ids_from_tokenizer(bb.tokenizer)
    eta = calibrate_eta(bb.embeddings, 0.3, [t for r in rows for t in r], bb.special_ids,
                        candidate_ids=cand, tol=0.02)
    priv = Privatizer(bb.embeddings, eta, special_ids=bb.special_ids, candidate_ids=cand,
                      seed=seed)
    return [priv.privatize_ids(torch.tensor(r)).tolist() for r in rows]


@pytest.fixture()
def pairs(tiny_bert):
    """Training pairs and held-out pairs (other sentences, fresh noise)."""
    train = _rows(tiny_bert.tokenizer, 500, seed=0)
    test = _rows(tiny_bert.tokenizer, 100, seed=1)
    return train, _privatize(tiny_bert, train, 0), test, _privatize(tiny_bert, test, 1)


def _text_states(model, rows, cls_id: int, sep_id: int) -> list[torch.Tensor]:
    """Last hidden states at the text positions of ``[CLS] row [SEP]``, one row at a time (no
    padding, no rapt code in between)."""
    out = []
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([[cls_id, *r, sep_id]])
            out.append(model(input_ids=ids).last_hidden_state[0, 1:-1])
    return out


def _mse(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return float(torch.cat([(x - y).pow(2).mean(-1) for x, y in zip(a, b, strict=True)]).mean())


def test_training_lowers_held_out_distillation_loss(tiny_bert, pairs):
    train_c, train_p, test_c, test_p = pairs
    log: list[dict] = []
    ad = train_channel_adapter(tiny_bert, train_c, train_p, FAST, progress=log.append)
    assert log[-1]["step"] == log[-1]["total_steps"] == 160 and "pooled_cos" in log[-1]
    raw = distillation_loss(tiny_bert, tiny_bert, test_c, test_p, max_length=16)
    adapted = distillation_loss(tiny_bert, ad.adapted_backbone(tiny_bert), test_c, test_p,
                                max_length=16)
    assert raw["rows"] == adapted["rows"] == 100
    assert adapted["loss"] < 0.93 * raw["loss"], (adapted, raw)
    assert adapted["hidden_mse"] < raw["hidden_mse"]
    assert adapted["pooled_cos"] > raw["pooled_cos"]
    # No step taken: LoRA's B is 0, so the adapted backbone reads exactly as the raw one.
    still = train_channel_adapter(tiny_bert, train_c, train_p, FAST, should_stop=lambda: True)
    assert still.meta["steps"] == 0 and still.meta["stopped"]
    same = distillation_loss(tiny_bert, still.adapted_backbone(tiny_bert), test_c, test_p,
                             max_length=16)
    assert same["loss"] == pytest.approx(raw["loss"], rel=1e-5)


def test_adapted_states_on_privatized_rows_are_closer_to_the_clean_teacher(tiny_bert, pairs):
    """Measured with plain model calls, one row at a time, outside the training code."""
    train_c, train_p, test_c, test_p = pairs
    ad = train_channel_adapter(tiny_bert, train_c, train_p, FAST)
    adapted = ad.adapted_backbone(tiny_bert)
    assert adapted.name == "tiny-bert+channel-adapter" and adapted.extra["channel_adapted"]
    assert type(adapted.model) is type(tiny_bert.model)  # merged: a plain model, no peft
    assert not any("lora" in n for n, _ in adapted.model.named_parameters())
    cls_id, sep_id = tiny_bert.tokenizer.cls_token_id, tiny_bert.tokenizer.sep_token_id
    teacher = _text_states(tiny_bert.model, test_c, cls_id, sep_id)
    raw = _mse(_text_states(tiny_bert.model, test_p, cls_id, sep_id), teacher)
    ours = _mse(_text_states(adapted.model, test_p, cls_id, sep_id), teacher)
    assert ours < 0.93 * raw, (ours, raw)
    # The merge is the trained student: same states as the unmerged peft model.
    student = ad._student(tiny_bert).eval()
    assert torch.allclose(torch.cat(_text_states(student, test_p[:10], cls_id, sep_id)),
                          torch.cat(_text_states(adapted.model, test_p[:10], cls_id, sep_id)),
                          atol=1e-5)


def test_callers_backbone_is_never_modified(tiny_bert, pairs):
    from rapt.tuning.tune import TuneConfig, tune

    train_c, train_p, _, test_p = pairs
    model = tiny_bert.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    modules = [type(m) for m in model.modules()]
    ad = train_channel_adapter(tiny_bert, train_c[:64], train_p[:64],
                               ChannelAdapterConfig(epochs=1, batch_size=16, max_length=16))
    adapted = ad.adapted_backbone(tiny_bert)
    tune(adapted, test_p[:16], [r[0] % 2 for r in test_p[:16]], 2,
         TuneConfig(method="lora", epochs=1, batch_size=8, lr=1e-2, head="linear"))
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in after)
    assert grads == {n: p.requires_grad for n, p in model.named_parameters()}
    assert modules == [type(m) for m in model.modules()] and not model.training
    assert adapted.model is not model and adapted.tokenizer is tiny_bert.tokenizer
    assert torch.equal(adapted.embeddings, tiny_bert.embeddings)  # the privatizer's embeddings


def test_adapter_never_receives_original_ids_at_tune_or_predict(tiny_bert, pairs):
    from rapt.tuning.tune import TuneConfig, tune

    train_c, train_p, test_c, test_p = pairs
    ad = train_channel_adapter(tiny_bert, train_c[:64], train_p[:64],
                               ChannelAdapterConfig(epochs=1, batch_size=16, max_length=16))
    # It keeps no training rows (_adapted: the merged copies of the backbones it has read).
    assert set(vars(ad)) == {"config", "tensors", "meta", "_adapted"}
    adapted = ad.adapted_backbone(tiny_bert)
    seen: list[torch.Tensor] = []
    adapted.model.get_input_embeddings().register_forward_pre_hook(
        lambda _m, args: seen.append(args[0].clone()))
    rows, labels = test_p[:24], [r[0] % 2 for r in test_p[:24]]
    cfg = TuneConfig(method="prompt", num_virtual_tokens=2, epochs=1, batch_size=8, lr=1e-2,
                     head="linear")
    tuned = tune(adapted, rows, labels, 2, cfg)
    tuned.predict_proba(adapted, test_p[24:40])
    special = set(tiny_bert.special_ids)
    got = {tuple(int(t) for t in r if int(t) not in special) for b in seen for r in b}
    assert got == {tuple(r) for r in test_p[:40]}
    assert got != {tuple(r) for r in test_c[:40]}  # the privatized rows differ from the clean


def test_save_load_round_trip_with_provenance(tiny_bert, pairs, tmp_path):
    from rapt.models import from_model

    train_c, train_p, test_c, test_p = pairs
    cfg = ChannelAdapterConfig(lora_r=4, layers=(1,), epochs=1, batch_size=32, max_length=16)
    ad = train_channel_adapter(tiny_bert, train_c[:96], train_p[:96], cfg,
                               meta={"corpus": {"sources": ["chain grammar"]}, "eta": 12.5})
    # Block 1 only: q, k, v and its 3 dense projections, A and B each.
    assert all(".layer.1." in k for k in ad.tensors) and len(ad.tensors) == 6 * 2
    folder = ad.save(tmp_path / "ad")
    doc = json.loads((folder / "config.json").read_text())
    assert doc["format"] == "rapt-channel-adapter" and doc["config"]["layers"] == [1]
    assert doc["meta"]["eta"] == 12.5 and doc["meta"]["backbone"] == "tiny-bert"
    assert doc["meta"]["corpus"] == {"sources": ["chain grammar"]}
    assert doc["meta"]["tokens"] == sum(len(r) for r in train_c[:96])
    back = ChannelAdapter.load(folder, tiny_bert)
    assert back.config == ad.config and back.meta == doc["meta"]
    assert back.tensors.keys() == ad.tensors.keys()
    assert all(torch.equal(back.tensors[k], ad.tensors[k]) for k in ad.tensors)
    a = distillation_loss(tiny_bert, ad.adapted_backbone(tiny_bert), test_c, test_p,
                          max_length=16)
    b = distillation_loss(tiny_bert, back.adapted_backbone(tiny_bert), test_c, test_p,
                          max_length=16)
    assert a == b
    # Another backbone (other width), a broken config: errors name the file.
    from transformers import BertConfig, BertModel

    tok = tiny_bert.tokenizer
    wide = from_model(BertModel(BertConfig(vocab_size=len(tok), hidden_size=48,
                                           num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=64)), tok, "wide")
    with pytest.raises(ArtifactError, match="channel_adapter.safetensors.*tiny-bert"):
        ChannelAdapter.load(folder, wide)
    doc["config"]["lora_r"] = 0
    (folder / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="config.json: field 'config'.*lora_r"):
        ChannelAdapter.load(folder, tiny_bert)


def test_training_is_seeded_and_checks_its_rows(tiny_bert, pairs):
    train_c, train_p, _, _ = pairs
    cfg = ChannelAdapterConfig(epochs=1, batch_size=32, max_length=16, seed=3)
    a = train_channel_adapter(tiny_bert, train_c[:64], train_p[:64], cfg)
    b = train_channel_adapter(tiny_bert, train_c[:64], train_p[:64], cfg)
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    with pytest.raises(ValueError, match="aligned token by token; row 1"):
        train_channel_adapter(tiny_bert, train_c[:2], [train_p[0], train_p[1][:-1]], cfg)
    with pytest.raises(ValueError, match="layers"):
        train_channel_adapter(tiny_bert, train_c[:2], train_p[:2],
                              ChannelAdapterConfig(layers=(5,)))


def test_causal_backbone_keeps_its_lm_head(tiny_llama, pairs):
    train_c, train_p, test_c, test_p = pairs
    ad = train_channel_adapter(tiny_llama, train_c[:64], train_p[:64],
                               ChannelAdapterConfig(epochs=1, batch_size=32, max_length=16))
    assert any("down_proj" in k for k in ad.tensors)
    adapted = ad.adapted_backbone(tiny_llama)
    assert type(adapted.model) is type(tiny_llama.model) and adapted.kind == "causal"
    out = distillation_loss(tiny_llama, adapted, test_c[:8], test_p[:8], max_length=16)
    assert out["rows"] == 8 and out["loss"] > 0
