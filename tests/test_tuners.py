"""Tuners on tiny random backbones: shapes, what trains, positions, broadcast protocol."""

from __future__ import annotations

import pytest
import torch
from _tiny import TOY_WORDS, make_bert, make_llama, make_tokenizer

from rapt.tuning.tune import RaptModel, TuneConfig
from rapt.tuning.tuners import METHODS, build_tuner


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tuner_tok"), TOY_WORDS)


_bert, _llama = make_bert, make_llama


@pytest.fixture(params=["bert", "llama"])
def bb(request, tok):
    return _bert(tok) if request.param == "bert" else _llama(tok)


def _batch(tok):
    enc = tok(["good movie", "the plot was very boring and long", "fun"], padding=True,
              return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


@pytest.mark.parametrize("method", METHODS)
def test_forward_shape_and_trainable_params(bb, method):
    before = {k: v.clone() for k, v in bb.model.state_dict().items()}
    tuner = build_tuner(bb, method, num_virtual_tokens=3)
    ids, mask = _batch(bb.tokenizer)
    h = tuner(ids, mask)
    assert h.shape == (*ids.shape, bb.hidden_size)
    names = [n for n, p in tuner.named_parameters() if p.requires_grad]
    if method == "prompt":
        assert names == ["prompt"]
    elif method == "prefix":
        assert names == ["prefix"]
    elif method == "lora":
        assert names and all("lora_" in n for n in names)
    else:
        assert len(names) == len(list(tuner.parameters()))
    h.pow(2).mean().backward()
    assert all(p.grad is None for p in bb.model.parameters())  # shared backbone: no grads
    for k, v in bb.model.state_dict().items():  # and untouched (LoRA/full train a copy)
        assert torch.equal(v, before[k]), k


def test_prefix_parameter_shape_follows_kv_heads(tok):
    llama = _llama(tok)
    t = build_tuner(llama, "prefix", num_virtual_tokens=4)
    # 2 layers x (key, value) x 2 kv heads x head_dim 8
    assert t.prefix.shape == (4, 2 * 2 * 2 * 8)


def test_prompt_positions_align_with_inputs(bb):
    """Output row i is input token i: equal to running the backbone on [P; X] by hand and
    dropping the N prompt rows (padding of the inputs stays masked)."""
    from rapt.tuning.tuners import base_model

    tuner = build_tuner(bb, "prompt", num_virtual_tokens=2)
    ids, mask = _batch(bb.tokenizer)
    emb = bb.model.get_input_embeddings()(ids)
    full = torch.cat([tuner.prompt.unsqueeze(0).expand(3, -1, -1), emb], 1)
    fmask = torch.cat([torch.ones(3, 2, dtype=mask.dtype), mask], 1)
    ref = base_model(bb.model)(inputs_embeds=full, attention_mask=fmask).last_hidden_state[:, 2:]
    torch.testing.assert_close(tuner(ids, mask), ref)


def test_prefix_changes_every_layer_input(bb):
    """A non-zero prefix changes the states; a second tuner with the same seed agrees."""
    from rapt.tuning.tuners import base_model

    ids, mask = _batch(bb.tokenizer)
    plain = base_model(bb.model)(input_ids=ids, attention_mask=mask).last_hidden_state
    a = build_tuner(bb, "prefix", num_virtual_tokens=2, seed=3)
    b = build_tuner(bb, "prefix", num_virtual_tokens=2, seed=3)
    with torch.no_grad():
        a.prefix.mul_(50)
        b.prefix.mul_(50)
    ha = a(ids, mask)
    assert not torch.allclose(ha, plain, atol=1e-3)
    torch.testing.assert_close(ha, b(ids, mask))


def test_broadcast_protocol_sums_to_param_grad(bb):
    for method in ("prompt", "prefix"):
        tuner = build_tuner(bb, method, num_virtual_tokens=3)
        tuner.track_per_example = True
        ids, mask = _batch(bb.tokenizer)
        tuner(ids, mask).pow(2).sum().backward()
        pairs = tuner.per_example_tensors()
        assert len(pairs) == 1
        p, e = pairs[0]
        assert e.shape == (ids.shape[0], *p.shape)
        torch.testing.assert_close(e.grad.sum(0), p.grad, rtol=1e-5, atol=1e-6)


def test_no_per_example_overhead_without_dp(bb):
    tuner = build_tuner(bb, "prompt", num_virtual_tokens=2)
    ids, mask = _batch(bb.tokenizer)
    tuner(ids, mask)
    with pytest.raises(RuntimeError):
        tuner.per_example_tensors()


@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_rec_head_reads_plain_positions(bb, method):
    cfg = TuneConfig(method=method, num_virtual_tokens=2, rec_hidden=8)
    model = RaptModel(bb, cfg, 2, rec_vocab=list(range(10)), plain_len=3, offset=1).eval()
    ids, mask = _batch(bb.tokenizer)
    logits, rec, hidden = model(ids, mask)
    assert logits.shape == (3, 2) and rec.shape == (3, 3, 10)
    torch.testing.assert_close(rec, model.rec_head(hidden[:, 1:4]))


def test_unknown_method(tok):
    with pytest.raises(ValueError, match="unknown tuning method"):
        build_tuner(_bert(tok), "adapterz")


@pytest.mark.parametrize("method", ["lora", "full"])
def test_private_copy_leaves_out_hooks_on_the_shared_backbone(bb, method):
    """Old behaviour: the service's pass counter (a forward hook bound to an object holding
    locks) sat on the shared backbone, and the deep copy of LoRA / full tuning failed with
    "cannot pickle '_thread.RLock' object", so those prompts could be neither tuned nor served
    while the service ran."""
    import threading

    class Counter:
        def __init__(self):
            self.lock, self.n = threading.RLock(), 0

        def __call__(self, *args):
            self.n += 1

    counter = Counter()
    handle = bb.model.register_forward_hook(counter)
    try:
        tuner = build_tuner(bb, method)
        ids = torch.tensor([[2, 7, 8, 3]])
        tuner(ids, torch.ones_like(ids))
        assert counter.n == 0 and not tuner.copy._forward_hooks  # the copy is not counted
        bb.model(input_ids=ids)
        assert counter.n == 1  # the shared backbone keeps its hook
    finally:
        handle.remove()


def test_prefix_forward_raises_no_future_warning(bb):
    """Issue 32 item 6: transformers 5.2x renamed ``past_key_values`` to ``cache`` and warned
    on every prefix run; the pre-filled cache now goes under the name the body takes."""
    import warnings

    t = build_tuner(bb, "prefix", num_virtual_tokens=3)
    ids = torch.tensor([[2, 7, 8, 3]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        t(ids, torch.ones_like(ids))


def test_split_causal_blocks_log_no_cache_deprecation(tok, caplog):
    """The split bottom's causal mask takes its (empty) cache under the current keyword: no
    '`past_key_values` ... deprecated' line from transformers (issue 32 item 6)."""
    import logging
    import warnings

    from rapt.split import split_backbone

    bb = _llama(tok)
    bottom, _ = split_backbone(bb, 1)
    ids = torch.tensor([[2, 7, 8, 3]])
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error", FutureWarning)
        bottom(ids, torch.ones_like(ids))
    assert "deprecated" not in caplog.text
