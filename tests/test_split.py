"""Split-and-Privatize (rapt.split): the split is exact, one protocol step equals one step of
the unsplit model, messages are checked, labels stay with the customer, CTI ∞ passes
contributing tokens, privacy noise is seeded only on request."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from rapt.models import from_model
from rapt.split import (
    ActivationGrad,
    Activations,
    OutputGrad,
    SplitConfig,
    SplitProtocolError,
    TopOutput,
    encode_texts,
    predict_split,
    setup_split,
    split_backbone,
    train_split,
)
from rapt.split.customer import _pad
from rapt.tuning.tuners import base_model

TEXTS = ["the movie was good and fun", "bad plot and awful actors", "great story",
         "boring and dull film", "a brilliant and funny scene", "the worst movie ever",
         "really nice music", "terrible and weak plot"]
LABELS = [1, 0, 1, 0, 1, 0, 1, 0]


def _bert(tok, layers: int = 3, seed: int = 0):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=layers,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    return from_model(BertModel(cfg).eval(), tok, name="tiny-bert3", kind="encoder")


def _llama(tok, layers: int = 3, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                      max_position_embeddings=64, pad_token_id=tok.pad_token_id)
    return from_model(LlamaForCausalLM(cfg).eval(), tok, name="tiny-llama3", kind="causal")


BUILDERS = {"encoder": _bert, "causal": _llama}


def _rows(bb):
    return encode_texts(bb.tokenizer, TEXTS, 16)


def _pool(h, mask, kind):
    if kind == "causal":
        last = mask.sum(1) - 1
        return h[torch.arange(h.shape[0]), last]
    m = mask.float().unsqueeze(-1)
    return (h * m).sum(1) / m.sum(1)


@pytest.mark.parametrize("kind", ["encoder", "causal"])
@pytest.mark.parametrize("n", [0, 1, 2])
def test_split_forward_equals_unsplit(tiny_tokenizer, kind, n):
    bb = BUILDERS[kind](tiny_tokenizer)
    ids, mask = _pad(_rows(bb), bb.tokenizer.pad_token_id)
    want = _pool(base_model(bb.model)(input_ids=ids, attention_mask=mask).last_hidden_state,
                 mask, kind)
    bottom, top = split_backbone(bb, n)
    assert bottom.num_blocks == n and top.num_blocks == 3 - n
    g = top(bottom(ids, mask), mask)
    assert torch.allclose(g, want, atol=1e-5), (g - want).abs().max()
    # the bottom stops where it should: a deeper cut changes what is released
    if n:
        other, _ = split_backbone(bb, n - 1)
        assert not torch.allclose(other(ids, mask), bottom(ids, mask), atol=1e-3)


def test_split_refuses_bad_layer(tiny_tokenizer):
    bb = _bert(tiny_tokenizer)
    for bad in (-1, 3, True):
        with pytest.raises(ValueError, match="split layer"):
            split_backbone(bb, bad)
    with pytest.raises(ValueError, match="0..2"):
        setup_split(bb, SplitConfig(split_layer=3), 2, 8)


def _reference_step(bb, n, top, head, rows, labels, cfg, unfreeze):
    """One AdamW step of the *unsplit* model (HF body with LoRA on the same top blocks)."""
    from peft import LoraConfig, inject_adapter_in_model

    model = copy.deepcopy(base_model(bb.model))
    for p in model.parameters():
        p.requires_grad_(False)
    top_idx = "|".join(str(i) for i in range(n, 3))
    targets = (rf".*encoder\.layer\.({top_idx})\.attention\.self\.(query|value)"
               if bb.kind == "encoder" else rf".*layers\.({top_idx})\.self_attn\.(q_proj|v_proj)")
    inject_adapter_in_model(LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                       target_modules=targets), model)
    layers = model.encoder.layer if bb.kind == "encoder" else model.layers
    top_state = {k: v for k, v in top.state_dict().items() if "lora_" in k}
    with torch.no_grad():
        mine = dict(model.named_parameters())
        for k, v in top_state.items():
            i, rest = k.removeprefix("blocks.layers.").split(".", 1)
            mine[f"{'encoder.layer' if bb.kind == 'encoder' else 'layers'}.{int(i) + n}."
                 f"{rest}"].copy_(v)
    lora = [p for name, p in model.named_parameters() if "lora_" in name]
    for p in lora:
        p.requires_grad_(True)
    embed = model.embeddings if bb.kind == "encoder" else model.embed_tokens
    bottom_params = list(embed.parameters()) + [p for layer in layers[:n]
                                                for p in layer.parameters()]
    if unfreeze:
        for p in bottom_params:
            p.requires_grad_(True)
    head = copy.deepcopy(head)
    ids, mask = _pad(rows, bb.tokenizer.pad_token_id)
    captured = {}
    cut = embed if n == 0 else layers[n - 1]

    def grab(module, inputs, out):
        # a frozen bottom's output is a leaf here, so its gradient can be read
        out = out if out.requires_grad else out.detach().requires_grad_(True)
        out.retain_grad()
        captured["h"] = out
        return out

    hook = cut.register_forward_hook(grab)
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    hook.remove()
    g = _pool(hidden, mask, bb.kind)
    g.retain_grad()
    loss = nn.functional.cross_entropy(head(g), torch.tensor(labels))
    loss.backward()
    grads = {"g": g.grad.clone(), "h": captured["h"].grad.clone(),
             "lora": [p.grad.clone() for p in lora],
             "bottom": [p.grad.clone() if p.grad is not None else None for p in bottom_params]}
    params = lora + list(head.parameters()) + (bottom_params if unfreeze else [])
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    opt.step()
    return grads, lora, head, bottom_params


@pytest.mark.parametrize("kind", ["encoder", "causal"])
@pytest.mark.parametrize("n,unfreeze", [(0, False), (1, True), (2, False), (0, True)])
def test_one_split_step_matches_unsplit_model(tiny_tokenizer, kind, n, unfreeze):
    bb = BUILDERS[kind](tiny_tokenizer)
    rows = _rows(bb)
    cfg = SplitConfig(split_layer=n, unfreeze_bottom=unfreeze, lr=1e-2, warmup_ratio=0.0,
                      batch_size=len(rows), epochs=1)
    customer, provider = setup_split(bb, cfg, 2, len(rows))
    with torch.no_grad():  # LoRA B starts at 0; make the step exercise both factors
        for name, p in provider.top.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    top0 = copy.deepcopy(provider.top)
    head0 = copy.deepcopy(customer.head)
    ref_grads, ref_lora, ref_head, ref_bottom = _reference_step(bb, n, top0, head0, rows, LABELS,
                                                                cfg, unfreeze)
    seen: dict[int, torch.Tensor] = {}
    lora = [p for name, p in provider.top.named_parameters() if "lora_" in name]
    hooks = [p.register_hook(lambda gr, i=i: seen.__setitem__(i, gr.clone()))
             for i, p in enumerate(lora)]
    seen_bottom: dict[int, torch.Tensor] = {}
    if unfreeze:
        hooks += [p.register_hook(lambda gr, i=i: seen_bottom.__setitem__(i, gr.clone()))
                  for i, p in enumerate(customer.bottom.parameters())]
    customer.load(rows, LABELS)
    acts = customer.release(list(range(len(rows))), 0)
    out = provider.forward(acts)
    grad, _ = customer.loss_grad(out)
    back = provider.backward(grad)
    if back is not None:
        customer.apply(back)
    for h in hooks:
        h.remove()
    assert torch.allclose(grad.grad, ref_grads["g"], atol=1e-6)
    # same LoRA parameters in the same module order on both sides
    assert len(seen) == len(ref_grads["lora"]) == 2 * 2 * (3 - n)
    for i, rg in enumerate(ref_grads["lora"]):
        assert rg.abs().sum() > 0
        assert torch.allclose(seen[i], rg, atol=1e-6), f"LoRA gradient {i} differs"
    for p, q in zip(lora, ref_lora, strict=True):
        assert torch.allclose(p, q, atol=1e-6)
    for p, q in zip(customer.head.parameters(), ref_head.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)
    if unfreeze:
        assert isinstance(back, ActivationGrad)
        valid = acts.mask.bool()
        assert torch.allclose(back.grad[valid], ref_grads["h"][valid], atol=1e-6)
        for i, rg in enumerate(ref_grads["bottom"]):
            assert torch.allclose(seen_bottom[i], rg, atol=1e-6), f"bottom gradient {i} differs"
        for (name, p), q in zip(customer.bottom.named_parameters(), ref_bottom, strict=True):
            assert torch.allclose(p, q, atol=1e-6), (name, (p - q).abs().max())
        # and the bottom really moved (the check above is not trivially true)
        fresh, _ = split_backbone(bb, n)
        assert any(not torch.equal(a, b) for a, b in zip(customer.bottom.parameters(),
                                                         fresh.parameters(), strict=True))
    else:
        assert back is None


def test_protocol_messages_are_checked():
    h, m = torch.randn(2, 3, 4), torch.tensor([[1, 1, 0], [1, 1, 1]])
    Activations(0, h, m)
    bad = [
        (dict(step=-1), "step"), (dict(step=True), "step"), (dict(step=1.0), "step"),
        (dict(hidden=h.double().numpy()), "hidden"), (dict(hidden=h[0]), "hidden"),
        (dict(hidden=h.long()), "hidden"), (dict(hidden=h.clone().index_fill_(0,
         torch.tensor([1]), float("nan"))), "hidden"),
        (dict(hidden=torch.zeros(2, 0, 4), mask=torch.zeros(2, 0, dtype=torch.long)), "hidden"),
        (dict(mask=m[:, :2]), "mask"), (dict(mask=m.float()), "mask"),
        (dict(mask=m * 2), "mask"), (dict(mask=torch.tensor([[0, 0, 0], [1, 1, 1]])), "mask"),
        (dict(mask=torch.tensor([[0, 1, 1], [1, 1, 1]])), "mask"),
    ]
    for change, fld in bad:
        kw = {"step": 0, "hidden": h, "mask": m, **change}
        with pytest.raises(SplitProtocolError, match=f"Activations.{fld}") as e:
            Activations(**kw)
        assert e.value.field == fld and isinstance(e.value, ValueError)
    with pytest.raises(SplitProtocolError, match="TopOutput.output"):
        TopOutput(0, torch.tensor([[float("inf")]]))
    with pytest.raises(SplitProtocolError, match="OutputGrad.grad"):
        OutputGrad(0, torch.randn(2, 3, 4))
    with pytest.raises(SplitProtocolError, match="ActivationGrad.grad"):
        ActivationGrad(0, torch.randn(2, 4))


def test_provider_refuses_out_of_order_and_misshapen_messages(tiny_tokenizer):
    bb = _bert(tiny_tokenizer)
    customer, provider = setup_split(bb, SplitConfig(split_layer=1), 2, 8)
    customer.load(_rows(bb), LABELS)
    with pytest.raises(SplitProtocolError, match="hidden.*expects 32"):
        provider.forward(Activations(0, torch.randn(1, 2, 31), torch.ones(1, 2, dtype=torch.long)))
    with pytest.raises(SplitProtocolError, match="OutputGrad.step.*no forward"):
        provider.backward(OutputGrad(0, torch.randn(2, 32)))
    acts = customer.release([0, 1], 0)
    provider.forward(acts)
    with pytest.raises(SplitProtocolError, match="Activations.step.*still waits"):
        provider.forward(customer.release([2, 3], 1))
    with pytest.raises(SplitProtocolError, match="OutputGrad.step.*pending forward is step 0"):
        provider.backward(OutputGrad(5, torch.randn(2, 32)))
    with pytest.raises(SplitProtocolError, match="OutputGrad.grad.*shape"):
        provider.backward(OutputGrad(0, torch.randn(3, 32)))
    assert provider.step == 0  # nothing was applied
    provider.backward(OutputGrad(0, torch.randn(2, 32)))
    assert provider.step == 1
    with pytest.raises(SplitProtocolError, match="not after step 0"):
        provider.forward(acts)
    # the customer checks what comes back from the provider just as strictly
    customer.release([4, 5], 1)
    with pytest.raises(SplitProtocolError, match="TopOutput.step"):
        customer.loss_grad(TopOutput(0, torch.randn(2, 32)))
    with pytest.raises(SplitProtocolError, match="TopOutput.output"):
        customer.loss_grad(TopOutput(1, torch.randn(2, 31)))
    with pytest.raises(SplitProtocolError, match="ActivationGrad.step"):
        customer.apply(ActivationGrad(1, torch.randn(2, 3, 32)))


def test_cti_infinite_multiplier_passes_contributing_tokens(tiny_tokenizer):
    bb = _bert(tiny_tokenizer)
    rows = _rows(bb)
    cfg = SplitConfig(eta=1.0, cti=True, cti_coverage=0.2, noise_seed=0)
    customer, _ = setup_split(bb, cfg, 2, len(rows))
    cti = customer.fit_cti(rows, LABELS)
    assert cti.token_ids, "the toy data must have contributing tokens"
    ids, mask = _pad(rows, bb.tokenizer.pad_token_id)
    priv = customer.privatize(ids)
    contrib = torch.isin(ids, torch.tensor(cti.token_ids))
    special = torch.isin(ids, torch.tensor(customer.special_ids))
    other = ~contrib & ~special
    assert contrib.any() and other.any()
    assert torch.equal(priv[contrib], ids[contrib])
    assert torch.equal(priv[special], ids[special])
    # η = 1 on 32-dim embeddings: the others are all but certainly replaced
    assert (priv[other] != ids[other]).float().mean() > 0.8
    # finite multiplier: contributing tokens get noise too (η·2 = 2 is still tiny)
    finite, _ = setup_split(bb, SplitConfig(eta=1.0, cti=True, cti_coverage=0.2,
                                            cti_multiplier=2.0, noise_seed=0), 2, len(rows))
    finite.fit_cti(rows, LABELS)
    assert (finite.privatize(ids)[contrib] != ids[contrib]).any()


def _recording(provider):
    log = []
    fwd, bwd = provider.forward, provider.backward
    provider.forward = lambda a, **k: (log.append(a), fwd(a, **k))[1]
    provider.backward = lambda g: (log.append(g), bwd(g))[1]
    return log


def test_labels_never_reach_the_provider(tiny_tokenizer):
    bb = _bert(tiny_tokenizer)
    rows = _rows(bb)
    logs = []
    for labels in (LABELS, [1 - y for y in LABELS]):
        cfg = SplitConfig(split_layer=1, eta=20.0, noise_seed=5, epochs=2, batch_size=4)
        customer, provider = setup_split(bb, cfg, 2, len(rows))
        log = _recording(provider)
        customer.load(rows, labels)
        train_split(customer, provider)
        logs.append(log)
        assert {type(m) for m in log} == {Activations, OutputGrad}
        for m in log:
            fields = set(vars(m))
            assert fields in ({"step", "hidden", "mask"}, {"step", "grad"})
    acts = [[m for m in log if isinstance(m, Activations)] for log in logs]
    grads = [[m for m in log if isinstance(m, OutputGrad)] for log in logs]
    # what the provider receives forward does not depend on the labels at all ...
    assert all(torch.equal(a.hidden, b.hidden) and torch.equal(a.mask, b.mask)
               for a, b in zip(*acts, strict=True))
    # ... while the customer's loss really used them (so the test could fail)
    assert not torch.allclose(grads[0][0].grad, grads[1][0].grad)


@pytest.mark.parametrize("kind", ["encoder", "causal"])
def test_split_training_learns(tiny_tokenizer, kind):
    bb = BUILDERS[kind](tiny_tokenizer)
    rows = _rows(bb)
    cfg = SplitConfig(split_layer=1, lr=3e-2, epochs=25, batch_size=4, warmup_ratio=0.0,
                      method="lora", lora_r=4)
    customer, provider = setup_split(bb, cfg, 2, len(rows))
    customer.load(rows, LABELS)
    hist = train_split(customer, provider)
    assert len(hist) == 2 * 25 and provider.step == 50
    first = sum(h["loss"] for h in hist[:2]) / 2
    last = sum(h["loss"] for h in hist[-2:]) / 2
    assert last < 0.5 * first
    pred = predict_split(customer, provider, rows).argmax(-1).tolist()
    assert sum(int(a == b) for a, b in zip(pred, LABELS, strict=True)) >= 7


def test_prompt_method_trains_only_the_prompt(tiny_tokenizer):
    bb = _llama(tiny_tokenizer)
    cfg = SplitConfig(split_layer=1, method="prompt", num_virtual_tokens=3, epochs=1,
                      batch_size=8)
    customer, provider = setup_split(bb, cfg, 2, 8)
    assert [n for n, p in provider.top.named_parameters() if p.requires_grad] == ["prompt"]
    before = provider.top.prompt.detach().clone()
    customer.load(_rows(bb), LABELS)
    train_split(customer, provider)
    assert not torch.equal(before, provider.top.prompt)


def test_padding_positions_are_released_as_zeros(tiny_tokenizer):
    bb = _bert(tiny_tokenizer)
    for unfreeze in (False, True):
        customer, _ = setup_split(bb, SplitConfig(split_layer=1, unfreeze_bottom=unfreeze),
                                  2, 8)
        customer.load(_rows(bb), LABELS)
        for acts in (customer.release(list(range(8)), 0), customer.encode(_rows(bb))):
            pad = ~acts.mask.bool()
            assert pad.any() and (acts.hidden[pad] == 0).all()
            assert (acts.hidden[~pad].abs().sum(-1) > 0).all()


def _first_release(bb, noise_seed):
    cfg = SplitConfig(split_layer=0, eta=10.0, noise_seed=noise_seed, batch_size=8)
    customer, _ = setup_split(bb, cfg, 2, 8)
    customer.load(_rows(bb), LABELS)
    return customer.release(list(range(8)), 0).hidden


def test_noise_is_seeded_only_on_request(tiny_tokenizer):
    bb = _bert(tiny_tokenizer)
    assert torch.equal(_first_release(bb, 7), _first_release(bb, 7))
    assert not torch.equal(_first_release(bb, 7), _first_release(bb, 8))
    assert not torch.equal(_first_release(bb, None), _first_release(bb, None))


def test_unfrozen_bottom_privatizes_afresh_every_release(tiny_tokenizer):
    bb = _bert(tiny_tokenizer)
    for unfreeze, differ in ((False, False), (True, True)):
        cfg = SplitConfig(eta=10.0, unfreeze_bottom=unfreeze, noise_seed=1, batch_size=8)
        customer, _ = setup_split(bb, cfg, 2, 8)
        customer.load(_rows(bb), LABELS)
        a = customer.release(list(range(8)), 0).hidden
        customer._pending = None
        b = customer.release(list(range(8)), 1).hidden
        assert (not torch.equal(a, b)) == differ


def test_provider_state_round_trip(tiny_tokenizer):
    bb = _bert(tiny_tokenizer)
    rows = _rows(bb)
    cfg = SplitConfig(split_layer=1, epochs=2, batch_size=4)
    customer, provider = setup_split(bb, cfg, 2, len(rows))
    customer.load(rows, LABELS)
    train_split(customer, provider)
    state = provider.state_dict()
    _, fresh = setup_split(bb, cfg, 2, len(rows))
    acts = customer.encode(rows)
    assert not torch.equal(fresh.forward(acts, train=False).output,
                           provider.forward(acts, train=False).output)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.forward(acts, train=False).output,
                       provider.forward(acts, train=False).output)
    assert fresh.step == provider.step == 4
    with pytest.raises(ValueError, match="kind"):
        fresh.load_state_dict({**state, "kind": "tune"})
    _, other = setup_split(bb, SplitConfig(split_layer=2, epochs=2, batch_size=4), 2, len(rows))
    with pytest.raises(ValueError, match="split_layer"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        fresh.load_state_dict({**state, "components": {**state["components"], "top": {}}})
    with pytest.raises(ValueError, match="n_examples 8"):
        _, fewer = setup_split(bb, cfg, 2, len(rows) - 1)  # 7 rows: 2 steps an epoch too
        fewer.load_state_dict(state)


def test_provider_state_is_the_training_loops_and_leaves_the_rng_alone(tiny_tokenizer):
    """The provider saves the training loop's TrainState (one resume format with `rapt tune`),
    without the process's random generator: the service runs other tenants' sessions in the
    same process, and loading one session must not set their random stream to its own."""
    from rapt.training.loop import STATE_FORMAT

    bb = _bert(tiny_tokenizer)
    rows = _rows(bb)
    cfg = SplitConfig(split_layer=1, epochs=2, batch_size=4)
    customer, provider = setup_split(bb, cfg, 2, len(rows))
    customer.load(rows, LABELS)
    train_split(customer, provider, should_stop=lambda: provider.step >= 3)
    state = provider.state_dict()
    assert (state["format"], state["kind"], state["step"]) == (STATE_FORMAT, "split-top", 3)
    assert state["n_examples"] == len(rows) and state["rng"] is None
    assert state["components"]["step_ids"] == {"last_step": 2}
    _, fresh = setup_split(bb, cfg, 2, len(rows))
    torch.manual_seed(123)
    before = torch.get_rng_state()
    fresh.load_state_dict(state)
    assert torch.equal(torch.get_rng_state(), before)
    assert (fresh.step, fresh._last_step) == (3, 2)


def test_provider_state_saved_before_the_loop_format_still_loads(tiny_tokenizer):
    """A session's flat state as the provider wrote it before it saved a TrainState (its
    layout written out here) resumes to the same top, optimizer and step ids; a flat state
    that lacks a part is refused naming it."""
    bb = _bert(tiny_tokenizer)
    rows = _rows(bb)
    cfg = SplitConfig(split_layer=1, epochs=2, batch_size=4)
    customer, provider = setup_split(bb, cfg, 2, len(rows))
    customer.load(rows, LABELS)
    train_split(customer, provider, should_stop=lambda: provider.step >= 3)
    flat = {"kind": "split-top", "method": cfg.method, "split_layer": cfg.split_layer,
            "total_steps": provider.total_steps, "step": provider.step,
            "last_step": provider._last_step, "top": provider.trainable_state(),
            "optimizer": copy.deepcopy(provider.optimizer.state_dict()),
            "scheduler": copy.deepcopy(provider.scheduler.state_dict())}
    _, fresh = setup_split(bb, cfg, 2, len(rows))
    fresh.load_state_dict(flat)
    assert (fresh.step, fresh._last_step) == (3, 2)
    for (k, a), b in zip(provider.trainable_state().items(), fresh.trainable_state().values(),
                         strict=True):
        assert torch.equal(a, b), k
    assert fresh.scheduler.state_dict() == provider.scheduler.state_dict()
    with pytest.raises(ValueError, match=r"lacks \['optimizer'\]"):
        fresh.load_state_dict({k: v for k, v in flat.items() if k != "optimizer"})


def test_split_config_validation():
    SplitConfig(eta=50.0, cti=True, cti_multiplier=math.inf)
    for kw, word in [(dict(split_layer=-1), "split_layer"), (dict(eta=0.0), "eta"),
                     (dict(eta=math.inf), "eta"), (dict(cti=True), "cti=True needs eta"),
                     (dict(eta=1.0, cti_multiplier=0.5), "cti_multiplier"),
                     (dict(cti_multiplier=math.nan), "cti_multiplier"),
                     (dict(method="prefix"), "prefix"), (dict(method="full"), "method"),
                     (dict(epochs=0), "epochs"), (dict(lr=-1.0), "lr"),
                     (dict(cti_coverage=0.0), "cti_coverage"), (dict(max_length=2), "max_length")]:
        with pytest.raises(ValueError, match=word):
            SplitConfig(**kw)
    c = SplitConfig(eta=3.0, cti=True)
    assert SplitConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="SplitConfig: unknown field.*etta"):
        SplitConfig.from_dict({**c.to_dict(), "etta": 1.0})


@pytest.mark.parametrize("split", [0, 1])
def test_resume_is_bit_exact_for_a_frozen_bottom(tiny_tokenizer, split):
    bb = _bert(tiny_tokenizer)
    rows = _rows(bb)
    cfg = SplitConfig(split_layer=split, eta=30.0, cti=True, cti_coverage=0.2, epochs=3,
                      batch_size=3, noise_seed=4)

    def parties():
        c, p = setup_split(bb, cfg, 2, len(rows))
        c.fit_cti(rows, LABELS)
        c.load(rows, LABELS)
        return c, p

    c_a, p_a = parties()
    train_split(c_a, p_a)
    c_b, p_b = parties()
    train_split(c_b, p_b, should_stop=lambda: p_b.step >= 4)  # mid-epoch 2
    assert p_b.step == 4
    pst, cst = p_b.state_dict(), c_b.state_dict()
    # a fresh customer draws other noise (another seed here) -- the saved release must win
    c_c, p_c = setup_split(bb, SplitConfig(**{**cfg.to_dict(), "noise_seed": 99,
                                              "cti_multiplier": math.inf}), 2, len(rows))
    c_c.fit_cti(rows, LABELS)
    c_c.load(rows, LABELS)
    c_c.load_state_dict(cst)
    p_c.load_state_dict(pst)
    train_split(c_c, p_c)
    assert p_c.step == p_a.step == 9
    for (k, a), b in zip(p_a.trainable_state().items(), p_c.trainable_state().values(),
                         strict=True):
        assert torch.equal(a, b), k
    for a, b in zip(c_a.head.parameters(), c_c.head.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="kind"):
        c_c.load_state_dict(pst)


@pytest.mark.integration
@pytest.mark.parametrize("name,n", [("minilm", 3), ("smollm2-135m", 4)])
def test_real_backbones_split_exactly(name, n, request):
    from rapt.models import load_backbone

    bb = request.getfixturevalue("smollm2") if name == "smollm2-135m" else load_backbone(name)
    rows = encode_texts(bb.tokenizer, ["The company reported strong profit growth .",
                                       "Sales fell ."], 32)
    ids, mask = _pad(rows, bb.tokenizer.pad_token_id)
    with torch.no_grad():
        want = _pool(base_model(bb.model)(input_ids=ids, attention_mask=mask).last_hidden_state,
                     mask, bb.kind)
        bottom, top = split_backbone(bb, n)
        assert torch.allclose(top(bottom(ids, mask), mask), want, atol=1e-4)


@pytest.mark.parametrize("unfreeze", [False, True])
def test_overflowing_gradient_changes_nothing_and_the_retry_applies(tiny_tokenizer, unfreeze):
    """Issue 29 item 1: a finite but huge ∂l/∂g (3e38 overflows float32 on the way back) is
    refused with the top, optimizer, scheduler and step as they were, the forward still
    pending; the correct gradient then gives exactly the step a clean run takes."""
    bb = _bert(tiny_tokenizer)
    cfg = SplitConfig(split_layer=1, unfreeze_bottom=unfreeze, batch_size=4, epochs=1)
    rows = _rows(bb)
    runs = []
    for _ in range(2):
        customer, provider = setup_split(bb, cfg, 2, len(rows))
        customer.load(rows, LABELS)
        runs.append((customer, provider))
    acts = runs[0][0].release([0, 1, 2, 3], 0)
    grad = torch.randn(4, 32)
    outs = []
    for i, (_, provider) in enumerate(runs):
        provider.forward(acts)
        if i == 1:
            before = copy.deepcopy(provider.state_dict()["components"])
            with pytest.raises(SplitProtocolError, match="OutputGrad.grad.*NaN or infinite"):
                provider.backward(OutputGrad(0, torch.full((4, 32), 3e38)))
            after = provider.state_dict()["components"]
            assert provider.step == 0 and provider.pending_step == 0
            assert after["scheduler"] == before["scheduler"]
            assert after["optimizer"]["state"] == before["optimizer"]["state"] == {}
            assert all(torch.equal(after["top"][k], v) for k, v in before["top"].items())
        outs.append(provider.backward(OutputGrad(0, grad)))
    assert runs[1][1].step == 1
    if unfreeze:
        assert torch.equal(outs[0].grad, outs[1].grad)
    ref, got = runs[0][1].trainable_state(), runs[1][1].trainable_state()
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_update_that_overflows_the_moments_is_undone(tiny_tokenizer):
    """A gradient finite everywhere whose square overflows AdamW's second moment (a silent
    freeze of every later step) is undone too; that forward is dropped and sent again."""
    bb = _bert(tiny_tokenizer)
    customer, provider = setup_split(bb, SplitConfig(split_layer=1, batch_size=2), 2, 8)
    customer.load(_rows(bb), LABELS)
    acts = customer.release([0, 1], 0)
    provider.forward(acts)
    top = copy.deepcopy(provider.trainable_state())
    # 1e30 puts AdamW's largest second moment at ~3.1e38, on float32's edge (3.4e38): whether
    # it overflows then depends on the CPU's rounding. 1e32 squares 1e4 times past it while the
    # gradients themselves (~6e22) stay far from overflowing.
    with pytest.raises(SplitProtocolError, match="optimizer state"):
        provider.backward(OutputGrad(0, torch.full((2, 32), 1e32)))
    assert provider.step == 0 and provider.pending_step is None
    assert provider.optimizer.state_dict()["state"] == {}
    assert all(torch.equal(v, provider.trainable_state()[k]) for k, v in top.items())
    provider.forward(acts)  # the same step id again (rewound)
    provider.backward(OutputGrad(0, torch.randn(2, 32)))
    assert provider.step == 1


@pytest.mark.parametrize("raw", ["²", "٣", "1²", "３", " 3", "+3", "-1", "", "3.0"])
@pytest.mark.parametrize("where", ["step", "width"])
def test_wire_integers_are_ascii_digits_only(raw, where):
    """Issue 29 item 5: str.isdigit() takes "²" (int() then raised: a 500) and "٣" (read as
    3); the metadata integers are ASCII digits or a SplitProtocolError naming the field."""
    from safetensors.torch import save

    from rapt.split import wire

    meta = {"message": "Activations", "step": "0", "width": "3", where: raw}
    body = save({"hidden": torch.randn(6, 4), "lengths": torch.tensor([3, 3], dtype=torch.int32)},
                metadata=meta)
    with pytest.raises(SplitProtocolError, match=f"Activations.{where}.*ASCII") as e:
        wire.decode(body, Activations, max_bytes=1 << 20)
    assert e.value.field == where
    meta[where] = "3" if where == "width" else "7"
    msg = wire.decode(save({"hidden": torch.randn(6, 4), "lengths": torch.tensor(
        [3, 3], dtype=torch.int32)}, metadata=meta), Activations, max_bytes=1 << 20)
    assert msg.hidden.shape == (2, 3, 4)
