"""Forward-pass precision (issue 31 item 1): fp32 | bf16 | auto, and what stays fp32.

Clipping depends on the per-example gradient norms, so the check that matters for privacy is
that bf16 autocast moves them by little: within NORM_RTOL (relative) of fp32 on a tiny model.
The clipping itself is computed in fp32 either way; the bound only says how far the clipped
contributions can move, never that a norm escapes the clip."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from rapt import precision as prec
from rapt.dp import DPSGD, DPConfig
from rapt.tuning.tune import RaptModel, TuneConfig, TunedPrompt, pad_batch, tune

# Stated tolerance: bf16 keeps 8 significant bits (2^-8 ≈ 0.4 % per rounding); through a
# 2-layer encoder and the backward pass the norms move by well under 1 % (measured: ≤ 0.2 %).
NORM_RTOL = 0.02
TEXTS = ["good movie", "the plot was very boring and long", "fun", "awful actor",
         "it is not a great film but fine", "music", "the best film ever", "sad and dull"]
LABELS = [1, 0, 1, 0, 1, 1, 1, 0]
DESCRIPTIONS = ["a bad review", "a good review"]


def _batch(tok):
    return pad_batch([tok(t)["input_ids"] for t in TEXTS], tok.pad_token_id)


def _per_example(bb, method: str, head: str, precision: str):
    """(per-example gradient norms (B,), per-example prompt gradients (B, ...), logits)
    through the DP engine after one micro-batch, no noise."""
    kw = {"label_descriptions": DESCRIPTIONS} if head == "label-description" else {}
    cfg = TuneConfig(method=method, num_virtual_tokens=4, head=head, precision=precision, **kw)
    model = RaptModel(bb, cfg, 2)
    eng = DPSGD(model, DPConfig(noise_multiplier=1.0, max_grad_norm=1.0), len(TEXTS), 1,
                batch_size=len(TEXTS), seed=0)
    try:
        ids, mask = _batch(bb.tokenizer)
        logits, _, hidden = model(ids, mask)
        F.cross_entropy(logits, torch.tensor(LABELS), reduction="none").sum().backward()
        name = "tuner.prompt" if method == "prompt" else "tuner.prefix"
        grads = eng.per_example_gradients()[name].clone()
        eng.accumulate()
        return eng.last_norms.clone(), grads, logits, hidden
    finally:
        eng.close()


def test_choices_and_auto(monkeypatch):
    assert prec.resolve_precision("fp32", "cpu") == "fp32"
    assert prec.resolve_precision("bf16", "cpu") == "bf16"
    monkeypatch.setattr(prec, "cpu_has_native_bf16", lambda: True)
    assert prec.resolve_precision("auto", "cpu") == "bf16"
    # bf16 on a GPU is never auto's choice: measured slower there (gpu_tune.md)
    assert prec.resolve_precision("auto", "cuda") == "fp32"
    assert prec.resolve_precision("bf16", "cuda") == "bf16"
    monkeypatch.setattr(prec, "cpu_has_native_bf16", lambda: False)
    assert prec.resolve_precision("auto", "cpu") == "fp32"
    with prec.autocast("auto", "cpu") as got:
        assert got == "fp32" and not torch.is_autocast_enabled("cpu")
    with prec.autocast("bf16", "cpu") as got:
        assert got == "bf16" and torch.is_autocast_enabled("cpu")
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16"):
        prec.resolve_precision("fp16", "cpu")
    with pytest.raises(ValueError, match="TuneConfig.precision"):
        TuneConfig(precision="fp16")
    assert TuneConfig().precision == "fp32"  # the default until bf16 is shown equal


def test_cpu_probe_agrees_with_cpuinfo():
    """torch's probe and /proc/cpuinfo's flags say the same about this machine."""
    try:
        flags = open("/proc/cpuinfo").read().split()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    assert prec.cpu_has_native_bf16() == any(f in flags for f in ("avx512_bf16", "amx_bf16"))


@pytest.mark.parametrize("method", ["prompt", "prefix"])
@pytest.mark.parametrize("head", ["linear", "label-description"])
def test_per_example_norms_within_tolerance(tiny_bert, method, head):
    n32, g32, l32, h32 = _per_example(tiny_bert, method, head, "fp32")
    n16, g16, l16, h16 = _per_example(tiny_bert, method, head, "bf16")
    # what stays fp32: the states the heads read, the logits, the per-example gradients
    assert h16.dtype == l16.dtype == g16.dtype == n16.dtype == torch.float32
    assert not torch.equal(h16, h32), "bf16 autocast did not change the backbone's pass"
    assert torch.allclose(n16, n32, rtol=NORM_RTOL, atol=0), (n16, n32)
    # the prompt/prefix part alone (the linear head's exact fp32 gradient does not hide it)
    pn16, pn32 = g16.flatten(1).norm(dim=1), g32.flatten(1).norm(dim=1)
    assert torch.allclose(pn16, pn32, rtol=NORM_RTOL, atol=0), (pn16, pn32)


def test_fp32_runs_no_autocast(tiny_bert):
    """fp32 is the plain pass, bit for bit (no autocast context changes it)."""
    cfg = TuneConfig(method="prompt", num_virtual_tokens=4, head="linear")
    model = RaptModel(tiny_bert, cfg, 2).eval()
    ids, mask = _batch(tiny_bert.tokenizer)
    with torch.no_grad():
        _, _, hidden = model(ids, mask)
        plain = model.tuner(ids, mask)
    assert torch.equal(hidden, plain)


@pytest.mark.parametrize("dp", [False, True])
def test_tune_and_predict_in_bf16(tiny_bert, tmp_path, dp):
    """Training (plain and DP-SGD) and predict run under bf16; the artifact records what the
    precision resolved to and loads with it."""
    tok = tiny_bert.tokenizer
    rows = [tok(t)["input_ids"] for t in TEXTS]
    cfg = TuneConfig(method="prefix", num_virtual_tokens=4, epochs=2, batch_size=4,
                     head="linear", precision="bf16",
                     dp=DPConfig(noise_multiplier=0.5, max_grad_norm=1.0, noise_seed=1)
                     if dp else None)
    tuned = tune(tiny_bert, rows, LABELS, 2, cfg)
    assert tuned.meta["precision"] == "bf16"
    assert (tuned.meta["dp"] is not None) == dp
    assert all(t.dtype == torch.float32 for t in tuned.tensors.values())
    probs = tuned.predict_proba(tiny_bert, rows)
    assert probs.dtype == torch.float32 and torch.allclose(probs.sum(1), torch.ones(len(rows)))
    loaded = TunedPrompt.load(tuned.save(tmp_path / "p"))
    assert loaded.config.precision == "bf16"
    assert torch.equal(loaded.predict_proba(tiny_bert, rows), probs)


def test_mixed_passes_group_by_precision(tiny_bert):
    """The service's mixed pass runs bf16 prompts under autocast and fp32 prompts without,
    never in one pass: each item equals its own predict_proba."""
    from rapt.service import mixed
    from rapt.service.inference import per_prompt_forward

    tok = tiny_bert.tokenizer
    rows = [tok(t)["input_ids"] for t in TEXTS]
    prompts = [tune(tiny_bert, rows, LABELS, 2,
                    TuneConfig(method="prompt", num_virtual_tokens=4, epochs=1, batch_size=4,
                               head="linear", seed=s, precision=p))
               for s, p in enumerate(["fp32", "bf16", "bf16"])]
    specs = [mixed.mixable(tiny_bert, p) for p in prompts]
    assert [s.precision for s in specs] == ["fp32", "bf16", "bf16"]
    items = [(p, rows[k:k + 4]) for k, p in enumerate(prompts)]
    got = mixed.forward(tiny_bert, items)
    want = per_prompt_forward(tiny_bert, items)
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=2e-3), (g, w)
    with pytest.raises(ValueError, match="one family and precision per group"):
        mixed.group_forward(tiny_bert, specs, [rows[:2]] * 3)


def test_job_and_demo_options():
    from pydantic import ValidationError

    from rapt.config import tune_config
    from rapt.demo import DemoConfig
    from rapt.service.schemas import JobCreate

    job = JobCreate(dataset_id="d", precision="bf16")
    assert tune_config(job.model_dump()).precision == "bf16"
    assert JobCreate(dataset_id="d").precision == TuneConfig().precision
    with pytest.raises(ValidationError):
        JobCreate(dataset_id="d", precision="fp16")
    assert DemoConfig(precision="auto").precision == "auto"
    with pytest.raises(ValueError, match="DemoConfig.precision"):
        DemoConfig(precision="half")


def test_cli_precision(tmp_path):
    """`rapt tune --precision bf16` records it; `rapt predict --precision` overrides it; a bad
    value is one error line, exit 2."""
    import json

    from _tiny import TOY_WORDS, make_bert, make_tokenizer, save_backbone
    from typer.testing import CliRunner

    from rapt.cli import app

    bb = str(save_backbone(make_bert(make_tokenizer(tmp_path, TOY_WORDS)), tmp_path / "bb"))
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "good film,pos\nbad film,neg\nfun plot,pos\n" * 2)
    art = tmp_path / "art"
    run = CliRunner().invoke
    r = run(app, ["tune", str(data), "--backbone", bb, "--eta", "20", "--epochs", "1",
                  "--batch-size", "2", "--num-virtual-tokens", "2", "--precision", "bf16",
                  "--out", str(art)])
    assert r.exit_code == 0, r.output
    meta = json.loads((art / "config.json").read_text())
    assert meta["config"]["precision"] == "bf16" and meta["meta"]["precision"] == "bf16"
    r = run(app, ["predict", str(art), str(data), "--noise-seed", "1", "--precision", "fp32"])
    assert r.exit_code == 0, r.output
    for argv in (["tune", str(data), "--backbone", bb, "--eta", "20", "--precision", "fp16",
                  "--out", str(tmp_path / "x")],
                 ["predict", str(art), str(data), "--precision", "fp16"]):
        r = run(app, argv)
        assert r.exit_code == 2 and "precision must be one of auto, fp32, bf16" in r.output, \
            r.output


@pytest.mark.parametrize("unfreeze", [False, True])
def test_sap_bottom_and_top_in_bf16(tiny_bert, unfreeze):
    """SAP: the bottom and the top run under bf16 autocast; the release, the top's output,
    ∂l/∂g and the gradient sent back are fp32 (output noise is added in fp32), and they stay
    within NORM_RTOL (norm of the difference, relative) of the fp32 run's."""
    from rapt.service.schemas import SapSessionCreate
    from rapt.split import SplitConfig, predict_split, setup_split

    tok = tiny_bert.tokenizer
    rows = [tok(t)["input_ids"] for t in TEXTS]
    seen: dict[str, list[torch.Tensor]] = {}
    for p in ("fp32", "bf16"):
        cfg = SplitConfig(split_layer=1, unfreeze_bottom=unfreeze, epochs=1,
                          batch_size=len(rows), eta=50.0, privatize="output", noise_seed=3,
                          precision=p)
        customer, provider = setup_split(tiny_bert, cfg, 2, len(rows))
        customer.load(rows, LABELS)
        acts = customer.release(list(range(len(rows))), 0)
        out = provider.forward(acts)
        grad, _ = customer.loss_grad(out)
        back = provider.backward(grad)
        seen[p] = [acts.hidden, out.output, grad.grad]
        if unfreeze:
            assert back is not None
            seen[p].append(back.grad)
            customer.apply(back)
        assert all(t.dtype == torch.float32 for t in seen[p])
        probs = predict_split(customer, provider, rows)
        assert probs.dtype == torch.float32 and torch.isfinite(probs).all()
    assert not torch.equal(seen["bf16"][1], seen["fp32"][1]), "the top did not run in bf16"
    for a, b in zip(seen["bf16"], seen["fp32"], strict=True):
        assert (a - b).norm() <= NORM_RTOL * b.norm(), ((a - b).norm(), b.norm())
    assert SplitConfig(precision="bf16").provider_view()["precision"] == "bf16"
    assert SapSessionCreate(backbone="b", n_examples=1, precision="bf16").precision == "bf16"
    with pytest.raises(ValueError, match="SplitConfig.precision"):
        SplitConfig(precision="half")
