"""Task heads on tiny random backbones: the reconstruction loss reaches the prompt, the frozen
label-description head, the linear head as before, head-only (freeze_prompt) runs, artifacts."""

from __future__ import annotations

import pytest
import torch
from _tiny import make_bert, make_llama
from torch.nn import functional as F

from rapt.tuning.heads import ClassificationHead, LabelDescriptionHead, Verbalizer
from rapt.tuning.reconstruction import build_rows, reconstruction_loss, sample_plain_tokens
from rapt.tuning.tune import RaptModel, TuneConfig, TunedPrompt, pad_batch, tune
from rapt.tuning.tuners import base_model

DESCS = ["a bad movie", "a good movie"]
POS, NEG = ["good", "great", "fun", "fine"], ["bad", "awful", "boring", "long"]


@pytest.fixture(params=["bert", "llama"])
def bb(request, tok):
    return make_bert(tok) if request.param == "bert" else make_llama(tok)


def _toy(n: int = 16):
    texts, labels = [], []
    for i in range(n):
        y = i % 2
        w = (POS if y else NEG)[(i // 2) % 4]
        texts.append(f"the movie was {w} and it was {w}")
        labels.append(y)
    return texts, labels


def _tuner_params(model: RaptModel) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.tuner.named_parameters() if p.requires_grad}


# --------------------------------------------------------------- reconstruction -> prompt


@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_rec_loss_gradient_reaches_the_prompt(bb, method):
    """∂L_rec/∂prompt ≠ 0: the reconstruction head reads the plain-token states, which the
    prompt (prompt tuning: through attention; prefix: in every layer) changes."""
    plain = sample_plain_tokens(bb.tokenizer, 3, seed=0)
    texts, _ = _toy(4)
    rows = build_rows(bb.tokenizer, texts, 32, plain)
    off = 1 if bb.kind == "encoder" else 0
    cfg = TuneConfig(method=method, num_virtual_tokens=3, rec_hidden=8)
    model = RaptModel(bb, cfg, 2, rec_vocab=plain + [7, 8], plain_len=3, offset=off).eval()
    ids, mask = pad_batch(rows, bb.tokenizer.pad_token_id)
    _, rec, _ = model(ids, mask)
    tgt = torch.tensor([[0, 1, 2]] * len(rows))
    reconstruction_loss(rec, tgt, "sum").sum().backward()
    params = _tuner_params(model)
    assert params
    for name, p in params.items():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert float(p.grad.abs().max()) > 1e-8, name
    assert model.head.linear.weight.grad is None  # the task head is not on L_rec's path


@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_reconstruction_changes_the_prompt_update(bb, method):
    """One optimizer step from the same init: rec_weight = 1 and rec_weight = 0 give different
    prompt tensors (a sign flip in Adam's first step moves an entry by 2·lr)."""
    plain = sample_plain_tokens(bb.tokenizer, 4, seed=1)
    texts, labels = _toy(8)
    rows = build_rows(bb.tokenizer, texts, 32, plain)
    lr = 1e-2
    out = {}
    for w in (0.0, 1.0):
        cfg = TuneConfig(method=method, num_virtual_tokens=3, lr=lr, epochs=1, batch_size=8,
                         reconstruction=True, rec_hidden=8, rec_vocab_size=12, rec_weight=w,
                         rec_reduction="sum", warmup_ratio=0.0)
        res = tune(bb, rows, labels, 2, cfg, plain_ids=plain)
        assert res.meta["steps"] == 1
        out[w] = res.tensors
    key = f"tuner.{method}"
    diff = (out[1.0][key] - out[0.0][key]).abs().max()
    assert float(diff) > 0.5 * lr, float(diff)


def test_rec_weight_zero_equals_no_reconstruction(tok):
    """Control for the test above: with a head that has no dropout, rec_weight = 0 leaves the
    prompt update exactly as without reconstruction, so the difference there is L_rec's."""
    bb = make_bert(tok)
    plain = sample_plain_tokens(tok, 4, seed=1)
    texts, labels = _toy(8)
    rows = build_rows(tok, texts, 32, plain)
    base = dict(method="prompt", num_virtual_tokens=3, lr=1e-2, epochs=1, batch_size=8,
                head="label-description", label_descriptions=DESCS, warmup_ratio=0.0)
    a = tune(bb, rows, labels, 2, TuneConfig(**base), plain_ids=plain)
    b = tune(bb, rows, labels, 2, TuneConfig(**base, reconstruction=True, rec_hidden=8,
                                             rec_vocab_size=12, rec_weight=0.0),
             plain_ids=plain)
    c = tune(bb, rows, labels, 2, TuneConfig(**base, reconstruction=True, rec_hidden=8,
                                             rec_vocab_size=12, rec_weight=1.0),
             plain_ids=plain)
    assert torch.equal(a.tensors["tuner.prompt"], b.tensors["tuner.prompt"])
    assert not torch.equal(a.tensors["tuner.prompt"], c.tensors["tuner.prompt"])


# --------------------------------------------------------------- label-description head


def _by_hand_embedding(bb, text: str, pooling: str) -> torch.Tensor:
    ids = torch.tensor([bb.tokenizer(text)["input_ids"]])
    with torch.no_grad():
        h = base_model(bb.model)(input_ids=ids, attention_mask=torch.ones_like(ids))
    h = h.last_hidden_state[0]
    return h.mean(0) if pooling == "mean" else h[-1]


def test_label_description_head_is_frozen_cosine_over_temperature(bb):
    cfg = TuneConfig(method="prompt", num_virtual_tokens=2, head="label-description",
                     label_descriptions=DESCS, head_temperature=0.05)
    model = RaptModel(bb, cfg, 2).eval()
    assert isinstance(model.head, LabelDescriptionHead) and model.head_kind == "label-description"
    assert list(model.head.parameters()) == []
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["tuner.prompt"]

    pooling = "mean" if bb.kind == "encoder" else "last"
    e = torch.stack([_by_hand_embedding(bb, d, pooling) for d in DESCS])
    torch.testing.assert_close(model.head.label_embeddings, e)

    texts, _ = _toy(4)
    ids, mask = pad_batch(build_rows(bb.tokenizer, texts, 32), bb.tokenizer.pad_token_id)
    with torch.no_grad():
        logits, _, hidden = model(ids, mask)
        if pooling == "mean":
            m = mask.unsqueeze(-1).float()
            pooled = (hidden * m).sum(1) / m.sum(1)
        else:
            pooled = hidden[torch.arange(len(texts)), mask.sum(1) - 1]
    want = torch.stack([torch.stack([F.cosine_similarity(x, y, dim=0) for y in e])
                        for x in pooled]) / 0.05
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)


def test_label_description_training_saves_prompt_and_embeddings_only(tok):
    bb = make_bert(tok)
    texts, labels = _toy(16)
    rows = build_rows(tok, texts, 32)
    cfg = TuneConfig(method="prompt", num_virtual_tokens=3, lr=5e-2, epochs=2, batch_size=8,
                     label_descriptions=DESCS)  # head="auto" picks it from the descriptions
    out = tune(bb, rows, labels, 2, cfg)
    assert out.meta["head"] == "label-description"
    assert set(out.tensors) == {"tuner.prompt", "head.label_embeddings"}
    assert out.tensors["head.label_embeddings"].shape == (2, bb.hidden_size)
    assert out.meta["steps"] == 4


def test_label_description_head_under_dp(tok):
    """PromptDPSGD accepts it: the head adds no parameter that needs a per-example path."""
    from rapt.dp import DPConfig

    bb = make_bert(tok)
    texts, labels = _toy(12)
    rows = build_rows(tok, texts, 32)
    cfg = TuneConfig(method="prompt", num_virtual_tokens=2, epochs=1, batch_size=6, lr=1e-2,
                     head="label-description", label_descriptions=DESCS,
                     dp=DPConfig(noise_multiplier=1.0, max_grad_norm=0.5, physical_batch_size=4,
                                 noise_seed=3))
    out = tune(bb, rows, labels, 2, cfg)
    assert out.meta["dp"] is not None and set(out.tensors) == {"tuner.prompt",
                                                                "head.label_embeddings"}


def test_head_config_errors(tok):
    bb = make_bert(tok)
    with pytest.raises(ValueError, match="head must be one of"):
        TuneConfig(head="mlm")
    with pytest.raises(ValueError, match="needs label_descriptions"):
        TuneConfig(head="label-description")
    with pytest.raises(ValueError, match="needs label_words"):
        TuneConfig(head="verbalizer")
    with pytest.raises(ValueError, match="label_descriptions must hold"):
        TuneConfig(label_descriptions=["only one"])
    with pytest.raises(ValueError, match="head_temperature"):
        TuneConfig(head_temperature=0.0)
    with pytest.raises(ValueError, match="causal LM"):
        RaptModel(bb, TuneConfig(head="verbalizer", label_words=["bad", "good"]), 2)
    with pytest.raises(ValueError, match="3 label descriptions for 2 labels"):
        RaptModel(bb, TuneConfig(label_descriptions=[*DESCS, "a fine movie"]), 2)


# --------------------------------------------------------------- linear head and defaults


def test_linear_head_is_the_default_and_unchanged(tok):
    """head="auto" without descriptions or label words is the linear head, as before; the
    explicit option gives the same tensors; a causal LM without label words gets it too (at
    the last position), and head="linear" overrides label words."""
    bert = make_bert(tok)
    texts, labels = _toy(16)
    rows = build_rows(tok, texts, 32)
    base = dict(method="prompt", num_virtual_tokens=3, lr=3e-2, epochs=2, batch_size=8, seed=2)
    a = tune(bert, rows, labels, 2, TuneConfig(**base))
    b = tune(bert, rows, labels, 2, TuneConfig(**base, head="linear"))
    assert a.meta["head"] == "linear" and set(a.tensors) == {"tuner.prompt", "head.linear.weight",
                                                             "head.linear.bias"}
    for k in a.tensors:
        assert torch.equal(a.tensors[k], b.tensors[k]), k
    assert TuneConfig.from_dict({"method": "prompt"}).head == "auto"  # old artifacts
    with pytest.raises(ValueError, match="TuneConfig: unknown field.*hed"):
        TuneConfig.from_dict({"method": "prompt", "hed": "linear"})

    llama = make_llama(tok)
    m = RaptModel(llama, TuneConfig(), 2)
    assert isinstance(m.head, ClassificationHead) and m.head.pooling == "last"
    assert isinstance(RaptModel(llama, TuneConfig(label_words=["bad", "good"]), 2).head,
                      Verbalizer)
    assert isinstance(RaptModel(llama, TuneConfig(head="linear", label_words=["bad", "good"]),
                                2).head, ClassificationHead)


# --------------------------------------------------------------- head-only control


def test_freeze_prompt_trains_only_the_head(tok):
    bb = make_bert(tok)
    texts, labels = _toy(16)
    rows = build_rows(tok, texts, 32)
    cfg = TuneConfig(method="prompt", num_virtual_tokens=3, lr=3e-2, epochs=2, batch_size=8,
                     freeze_prompt=True)
    init = RaptModel(bb, cfg, 2)
    out = tune(bb, rows, labels, 2, cfg)
    assert out.meta["steps"] == 4 and out.meta["freeze_prompt"]
    assert torch.equal(out.tensors["tuner.prompt"], init.tuner.prompt.detach())  # saved, at init
    assert not torch.equal(out.tensors["head.linear.weight"], init.head.linear.weight.detach())


@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_freeze_prompt_with_frozen_head_evaluates_the_init(tok, method):
    """Nothing to train: no step, the prompt at init, predictions as an untrained model's; the
    reconstruction head is not even built (L_rec acts only through the prompt)."""
    bb = make_bert(tok)
    plain = sample_plain_tokens(tok, 3, seed=0)
    texts, labels = _toy(8)
    rows = build_rows(tok, texts, 32, plain)
    cfg = TuneConfig(method=method, num_virtual_tokens=3, head="label-description",
                     label_descriptions=DESCS, freeze_prompt=True, reconstruction=True,
                     rec_vocab_size=10)
    seen = []
    out = tune(bb, rows, labels, 2, cfg, plain_ids=plain, progress=seen.append)
    assert out.meta["steps"] == 0 and out.meta["rec_vocab_size"] is None and not seen
    init = RaptModel(bb, cfg, 2, plain_len=3, offset=1).eval()
    key = f"tuner.{method}"
    assert torch.equal(out.tensors[key], getattr(init.tuner, method).detach())
    ids, mask = pad_batch(rows, tok.pad_token_id)
    with torch.no_grad():
        want = init(ids, mask)[0].softmax(-1)
    torch.testing.assert_close(out.predict_proba(bb, rows), want)


# --------------------------------------------------------------- artifacts


@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_label_description_artifact_round_trip(bb, method, tmp_path):
    texts, labels = _toy(16)
    rows = build_rows(bb.tokenizer, texts, 32)
    cfg = TuneConfig(method=method, num_virtual_tokens=3, lr=3e-2, epochs=1, batch_size=8,
                     head="label-description", label_descriptions=DESCS, head_temperature=0.1)
    out = tune(bb, rows, labels, 2, cfg)
    out.save(tmp_path / "p")
    loaded = TunedPrompt.load(tmp_path / "p")
    assert loaded.config == cfg and loaded.meta["head"] == "label-description"
    for k in out.tensors:
        assert torch.equal(loaded.tensors[k], out.tensors[k]), k
    torch.testing.assert_close(loaded.predict_proba(bb, rows), out.predict_proba(bb, rows),
                               rtol=0, atol=0)
    # The saved label embeddings are used, not recomputed: alter them and the predictions move.
    loaded.tensors["head.label_embeddings"] = loaded.tensors["head.label_embeddings"].flip(0)
    loaded._cache = None
    assert not torch.allclose(loaded.predict_proba(bb, rows), out.predict_proba(bb, rows))
