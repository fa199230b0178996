"""PromptDPSGD over the real tuners (rapt.tuning.tuners / rapt.tuning.tune): broadcast per-example
gradients equal single-example backward passes, and the trainer's DP branch runs end to end."""

from __future__ import annotations

import pytest
import torch
from _tiny import TOY_WORDS, make_bert, make_llama, make_tokenizer
from torch.nn import functional as F

from rapt.dp import DPSGD, DPConfig

trainer = pytest.importorskip("rapt.tuning.tune")

@pytest.fixture(scope="module")
def dp_tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("dp_tok"), TOY_WORDS)


@pytest.fixture()
def tiny_bert(dp_tok):
    return make_bert(dp_tok, name="dp-tiny-bert")


@pytest.fixture()
def tiny_llama(dp_tok):
    return make_llama(dp_tok, name="dp-tiny-llama")


def _rows(tok, n: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    texts = ["good movie", "the plot was very boring and long", "fun", "awful actor",
             "it is not a great film but fine"][:n]
    enc = tok(texts, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"], torch.tensor([1, 0, 1, 0, 1][:n])


def _loss(model, ids, mask, y, rec_t):
    logits, rec, _ = model(ids, mask)
    loss = F.cross_entropy(logits, y, reduction="none")
    if rec is not None:
        loss = loss + F.cross_entropy(rec.transpose(1, 2), rec_t[: ids.shape[0]],
                                      reduction="none").mean(1)
    return loss


@pytest.mark.parametrize(("backbone", "method", "projection"), [
    ("tiny_bert", "prompt", False), ("tiny_bert", "prefix", False),
    ("tiny_bert", "prefix", True), ("tiny_llama", "prompt", False),
    ("tiny_llama", "prefix", False),
])
def test_tuner_per_example_grads_match_naive(request, backbone, method, projection):
    bb = request.getfixturevalue(backbone)
    cfg = trainer.TuneConfig(method=method, num_virtual_tokens=3, prefix_projection=projection,
                             rec_hidden=8)
    # A reconstruction head over the first 2 positions exercises the 3-D nn.Linear path.
    model = trainer.RaptModel(bb, cfg, num_labels=2, rec_vocab=list(range(6)), plain_len=2,
                              offset=0)
    model.eval()  # no dropout: the batch and the single-example passes must be the same function
    model.tuner.track_per_example = True
    ids, mask, y = _rows(bb.tokenizer)
    rec_t = torch.randint(0, 6, (ids.shape[0], 2), generator=torch.Generator().manual_seed(0))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    naive: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    params = dict(model.named_parameters())
    for b in range(ids.shape[0]):
        model.zero_grad(set_to_none=True)
        sl = slice(b, b + 1)
        _loss(model, ids[sl], mask[sl], y[sl], rec_t[sl]).sum().backward()
        for n in names:
            naive[n].append(params[n].grad.clone())
    model.zero_grad(set_to_none=True)
    dp = DPSGD(model, DPConfig(noise_multiplier=1.0, sample_rate=0.5), n_examples=10, steps=1,
               seed=0)
    _loss(model, ids, mask, y, rec_t).sum().backward()
    got = dp.per_example_gradients()
    assert set(got) == set(names)
    assert any(n.startswith("tuner.") for n in names)
    for n in names:
        torch.testing.assert_close(got[n], torch.stack(naive[n]), rtol=1e-4, atol=1e-6)
    dp.close()


def _dp_toy(tiny_bert):
    tok = tiny_bert.tokenizer
    texts = ["good movie", "awful actor", "fun film", "boring plot", "great story",
             "bad music"] * 4
    return [tok(t)["input_ids"] for t in texts], [1, 0, 1, 0, 1, 0] * 4


def test_trainer_dp_branch_end_to_end(tiny_bert):
    """ε lands just under the target, the run is unseeded, and the config's seed (init, data
    order) does not seed the DP noise: two runs with one config seed differ.

    Mutations caught: passing ``config.seed`` into DPSGD (identical tensors, seeded true);
    calibrating σ for fewer steps than run (ε > 8); a σ far too large (ε ≪ 7.9)."""
    rows, labels = _dp_toy(tiny_bert)
    seen: list[dict] = []
    cfg = trainer.TuneConfig(method="prefix", num_virtual_tokens=2, epochs=2, batch_size=6,
                             lr=1e-2, seed=3, dp=DPConfig(target_epsilon=8.0, max_grad_norm=0.5,
                                                          physical_batch_size=4))
    out = trainer.tune(tiny_bert, rows, labels, 2, cfg, progress=seen.append)
    rec = out.meta["dp"]
    assert rec["steps"] == out.meta["steps"] == 8  # 2 epochs / q = 6/24
    assert 7.9 <= rec["epsilon"] <= 8.0 and rec["delta"] == 1e-5  # min(1e-5, 1/(10N))
    assert rec["seeded"] is False
    assert all("epsilon" in s for s in seen)
    assert [s["epsilon"] for s in seen] == sorted(s["epsilon"] for s in seen)
    again = trainer.tune(tiny_bert, rows, labels, 2, cfg)
    assert any(not torch.equal(out.tensors[k], again.tensors[k]) for k in out.tensors)
    # An explicit noise seed repeats the run exactly and says so.
    seeded = trainer.TuneConfig(**{**cfg.__dict__, "dp": DPConfig(
        target_epsilon=8.0, max_grad_norm=0.5, physical_batch_size=4, noise_seed=11)})
    a = trainer.tune(tiny_bert, rows, labels, 2, seeded)
    b = trainer.tune(tiny_bert, rows, labels, 2, seeded)
    assert a.meta["dp"]["seeded"] is True
    assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)


def test_dp_artifact_carries_no_private_statistics(tiny_bert, tmp_path):
    """Under DP the saved prompt holds no per-step losses / rec accuracy (not covered by ε) and
    its reconstruction vocabulary comes from the tokenizer, not the rows: T's size does not
    change when the private rows do. Mutations caught: keeping ``meta["history"]`` under DP;
    building T from the rows' token counts."""
    from rapt.tuning.reconstruction import candidate_plain_ids, plain_offset

    rows, labels = _dp_toy(tiny_bert)
    tok = tiny_bert.tokenizer
    k = [tok.convert_tokens_to_ids("good"), tok.convert_tokens_to_ids("plot")]
    off = plain_offset(tok)
    rows = [r[:off] + k + r[off:] for r in rows]
    dp = DPConfig(noise_multiplier=1.0, max_grad_norm=0.5, physical_batch_size=4)
    cfg = trainer.TuneConfig(method="prompt", num_virtual_tokens=2, epochs=1, batch_size=6,
                             lr=1e-2, reconstruction=True, rec_vocab_size=40, dp=dp)
    out = trainer.tune(tiny_bert, rows, labels, 2, cfg, plain_ids=k)
    assert "history" not in out.meta and len(out.train_log) == out.meta["steps"]
    out.save(tmp_path / "p")
    saved = (tmp_path / "p").read_bytes() if (tmp_path / "p").is_file() else b"".join(
        f.read_bytes() for f in sorted((tmp_path / "p").iterdir()))
    assert b"rec_acc" not in saved and b"task_loss" not in saved
    # Fewer distinct tokens in the rows: a row-frequency T would shrink, a public T does not.
    few = [r[:off] + k + r[off:off + 1] + r[-1:] for r in rows]
    other = trainer.tune(tiny_bert, few, labels, 2, cfg, plain_ids=k)
    assert out.meta["rec_vocab_size"] == other.meta["rec_vocab_size"] == min(
        40, len(candidate_plain_ids(tok)))
    # Without DP the history stays in the artifact (the user's own run, nothing promised).
    plain = trainer.tune(tiny_bert, rows, labels, 2, trainer.TuneConfig(
        method="prompt", num_virtual_tokens=2, epochs=1, batch_size=6, lr=1e-2))
    assert len(plain.meta["history"]) == plain.meta["steps"]
