"""The DP-agnostic training loop (rapt.training.loop) and its pin against the trainer's outputs.

``test_tune_outputs_are_pinned`` compares ``tune``'s final tensors and per-step history, per
method, with and without DP and reconstruction, with values recorded from the trainer before
it was split into ``run_loop`` + steps + objectives (``tests/data/tune_pin.pt``; rewrite with
``python tests/test_training.py --write`` only for an intended change of behaviour).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from _tiny import TOY_WORDS, make_bert, make_llama, make_tokenizer

from rapt.dp import DPConfig
from rapt.training.loop import (
    MeanStep,
    ModelOutput,
    Plan,
    SummedLoss,
    TaskCE,
    TrainableTensors,
    TrainState,
    length_split,
    run_loop,
)
from rapt.tuning.reconstruction import Reconstruction, build_rows, sample_plain_tokens
from rapt.tuning.tune import TuneConfig, tune

PIN = Path(__file__).parent / "data" / "tune_pin.pt"
WORDS = ["good", "great", "fun", "fine", "bad", "awful", "boring", "long"]
# DP history fields that the old trainer took from the last micro-batch only (issue 30): they
# are pinned by a dedicated test instead.
DP_BATCH_STATS = ("task_loss", "rec_loss", "rec_acc")


def _texts(n: int = 12) -> tuple[list[str], list[int]]:
    texts = [f"the movie was {WORDS[(3 * i) % 8]} and {WORDS[(5 * i + 1) % 8]}" for i in range(n)]
    return texts, [int((3 * i) % 8 < 4) for i in range(n)]


def _dp(**kw) -> DPConfig:
    return DPConfig(noise_multiplier=1.0, max_grad_norm=0.5, physical_batch_size=3,
                    noise_seed=7, **kw)


# name -> (backbone, TuneConfig kwargs, with plain tokens)
CASES: dict[str, tuple[str, dict, bool]] = {
    "prompt": ("bert", {"method": "prompt"}, False),
    "prefix": ("bert", {"method": "prefix"}, False),
    "lora": ("bert", {"method": "lora", "lr": 1e-2}, False),
    "full": ("bert", {"method": "full", "lr": 3e-3}, False),
    "prefix-rec": ("bert", {"method": "prefix", "reconstruction": True, "rec_hidden": 8,
                            "rec_vocab_size": 12}, True),
    "prompt-llama-rec": ("llama", {"method": "prompt", "reconstruction": True,
                                   "rec_vocab_size": 12, "warmup_ratio": 0.2}, True),
    "prompt-dp": ("bert", {"method": "prompt", "dp": "dp"}, False),
    "prefix-dp-rec": ("bert", {"method": "prefix", "reconstruction": True, "rec_hidden": 8,
                               "rec_vocab_size": 12, "dp": "dp"}, True),
    "prompt-plain-no-rec": ("bert", {"method": "prompt", "head": "linear"}, True),
}


def run_case(tok, name: str, resume: dict | None = None, **override):
    """-> (TunedPrompt, checkpoints) of pin case ``name`` (fresh tiny backbone each time)."""
    kind, kw, with_plain = CASES[name]
    bb = make_bert(tok) if kind == "bert" else make_llama(tok)
    texts, labels = _texts()
    plain = sample_plain_tokens(tok, 3, seed=0) if with_plain else None
    rows = build_rows(tok, texts, 24, plain)
    kw = dict(kw)
    if kw.get("dp") == "dp":
        kw["dp"] = _dp()
    kw = {"num_virtual_tokens": 3, "lr": 3e-2, "epochs": 2, "batch_size": 4, "seed": 2,
          "checkpoint_every": 3, **kw, **override}
    cfg = TuneConfig(**kw)
    states: list[dict] = []
    out = tune(bb, rows, labels, 2, cfg, plain_ids=plain, checkpoint=states.append,
               resume=resume)
    return out, states


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("training_tok"), TOY_WORDS)


def _record(out) -> dict:
    return {"tensors": {k: v.clone() for k, v in out.tensors.items()},
            "history": [dict(h) for h in out.train_log], "steps": out.meta["steps"]}


def _close_across_cpus(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """Bit-exact on the CPU that recorded the pins; elsewhere float rounding differs (an AMD
    EPYC moved LoRA entries whose gradients are tiny by 5e-6 on a scale of 0.19: Adam divides
    by √v and so magnifies rounding where v is small). The tolerance, 2e-4 of the tensor's
    scale, absorbs that and stays far below what a change of the loop moves (~1e-2)."""
    scale = float(want.abs().max()) or 1.0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-4 * scale, msg=name)


@pytest.mark.parametrize("name", list(CASES))
def test_tune_outputs_are_pinned(tok, name):
    """Mutations caught: a different batch order (seed of the permutation), the rec weight
    applied twice, the scheduler stepped before the optimizer, DP noise drawn per micro-batch."""
    want = torch.load(PIN, weights_only=True)[name]
    out, _ = run_case(tok, name)
    got = _record(out)
    assert got["steps"] == want["steps"]
    assert got["tensors"].keys() == want["tensors"].keys()
    for k, v in want["tensors"].items():
        if k.endswith("attention.self.key.bias"):
            # Softmax is invariant to a key bias, so its true gradient is 0: what it gets is
            # rounding noise, which Adam scales up to ~1e-6 steps that differ with the thread
            # count (OMP_NUM_THREADS 1 vs 2). It must stay tiny, not pinned.
            assert got["tensors"][k].abs().max() < 1e-4, k
            continue
        _close_across_cpus(got["tensors"][k], v, k)
    assert len(got["history"]) == len(want["history"])
    dp = CASES[name][1].get("dp") is not None
    for g, w in zip(got["history"], want["history"], strict=True):
        skip = DP_BATCH_STATS if dp else ()
        assert [k for k in g if k not in skip] == [k for k in w if k not in skip]
        for k in w:
            if k not in skip:
                assert g[k] == pytest.approx(w[k], rel=1e-5, abs=1e-6), (k, g, w)


def _roundtrip(state: dict, tmp_path: Path) -> dict:
    """Through the file, as the service worker stores and reads it."""
    torch.save(state, tmp_path / "ck.pt")
    return torch.load(tmp_path / "ck.pt", weights_only=True)


@pytest.mark.parametrize("name", ["prefix-rec", "lora", "prompt-llama-rec", "prefix-dp-rec"])
def test_resume_mid_epoch_is_exact(tok, name, tmp_path):
    """A run resumed from a mid-epoch checkpoint (step 2 of 3 in epoch 0) ends bit-equal to the
    uninterrupted one, history included. Mutations caught: not restoring the RNG, resuming at
    the epoch start (skip ignored), the optimizer state not loaded. Under DP with a noise seed
    the resumed steps' batches and noise derive from (seed, t), and ε counts every step once."""
    full, states = run_case(tok, name, checkpoint_every=2)
    assert [s["step"] for s in states] == [2, 4, 6] and states[0]["kind"] == "tune"
    resumed, _ = run_case(tok, name, resume=_roundtrip(states[0], tmp_path), checkpoint_every=2)
    for k, v in full.tensors.items():
        assert torch.equal(resumed.tensors[k], v), k
    assert resumed.train_log == full.train_log


def test_format1_checkpoint_still_resumes(tok):
    """Checkpoints written by the trainer before TrainState (flat dict, recorded in
    ``tests/data/tune_checkpoint_v1.pt`` at step 3) resume: exactly without DP, and under DP
    with the engine's step count (ε over all 6 steps, not the 3 resumed)."""
    old = torch.load(PIN.parent / "tune_checkpoint_v1.pt", weights_only=True)
    assert "kind" not in old["prefix-rec"] and old["prefix-rec"]["step"] == 3
    full, _ = run_case(tok, "prefix-rec")
    resumed, _ = run_case(tok, "prefix-rec", resume=old["prefix-rec"])
    for k, v in full.tensors.items():
        # The step-3 state was computed on the recording CPU, so only bit-exact there; exact
        # resumption on this CPU is test_resume_mid_epoch_is_exact's.
        _close_across_cpus(resumed.tensors[k], v, k)
    full_dp, _ = run_case(tok, "prefix-dp-rec")
    dp, _ = run_case(tok, "prefix-dp-rec", resume=old["prefix-dp-rec"])
    assert dp.meta["dp"]["steps"] == dp.meta["steps"] == 6
    assert dp.meta["dp"]["epsilon"] == full_dp.meta["dp"]["epsilon"]


def test_checkpoint_of_another_run_is_refused(tok):
    """TrainState.load_state_dict refuses another kind, method, N or DP setting, a model whose
    trainable tensors differ, and a newer format; each error names what differs."""
    _, states = run_case(tok, "prefix")
    good = states[0]
    bad = [({**good, "kind": "split-top"}, "kind 'split-top'"),
           ({**good, "n_examples": 99}, "n_examples 99"),
           ({**good, "format": 99}, "newer"),
           ({"step": 3}, "not a rapt training checkpoint"),
           ({k: v for k, v in good.items() if k != "rng"}, r"lacks \['rng'\]")]
    model = dict(good["components"]["model"])
    model.pop("tuner.prefix")
    bad.append(({**good, "components": {**good["components"], "model": model}},
                r"missing \['tuner.prefix'\]"))
    for state, match in bad:
        with pytest.raises(ValueError, match=match):
            run_case(tok, "prefix", resume=state)
    with pytest.raises(ValueError, match="method 'prefix'"):
        run_case(tok, "prompt", resume=good)
    with pytest.raises(ValueError, match="another DP setting"):
        run_case(tok, "prompt-dp", resume=run_case(tok, "prompt")[1][0])


def test_dp_stats_cover_the_whole_logical_batch(tok):
    """Under DP, task_loss / rec_loss average every micro-batch of the logical batch, so the
    reported loss is their weighted sum (the trainer before issue 30 reported the last
    micro-batch only, which fails this)."""
    out, _ = run_case(tok, "prefix-dp-rec", rec_weight=0.5)
    checked = 0
    for h in out.train_log:
        if "task_loss" in h:  # an empty Poisson batch has no stats
            assert h["loss"] == pytest.approx(h["task_loss"] + 0.5 * h["rec_loss"], rel=1e-5)
            checked += 1
    assert checked >= 3


class _ScriptedStep:
    """A GradientStep without DP or a model: the gradient of batch idx is -sum(idx)."""

    def __init__(self, param: torch.nn.Parameter) -> None:
        self.param = param
        self.plan = Plan(epochs=2, steps_per_epoch=3, total_steps=6)
        self.seen: list[list[int]] = []

    def batches(self, epoch: int, skip: int):
        return [torch.tensor([3 * epoch + b]) for b in range(3)][skip:]

    def compute(self, idx):
        self.seen.append(idx.tolist())
        self.param.grad = -idx.float().sum().reshape(1)
        return {"loss": float(idx.sum()), "mine": 1.0}

    def extra(self):
        return {"tag": "x"}

    def record(self):
        return None

    def components(self):
        return {}


def _loop_parts():
    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([w], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    step = _ScriptedStep(w)
    state = TrainState("toy", "sgd", 6, {"w": TrainableTensors(torch.nn.ParameterList([w])),
                                         "optimizer": opt, "scheduler": sched})
    return w, opt, sched, step, state


def test_run_loop_stops_checkpoints_and_resumes():
    """run_loop alone (no DP, no model): progress records, checkpoint cadence, should_stop,
    and a resume from a mid-epoch state that skips exactly the trained batches."""
    w, opt, sched, step, state = _loop_parts()
    seen, cks = [], []
    calls = iter(range(100))
    run_loop(step, opt, sched, state, progress=seen.append, checkpoint_every=2,
             checkpoint=lambda s: cks.append(s.state_dict()),
             should_stop=lambda: next(calls) >= 5)
    assert state.stopped and state.step == 5 and step.seen == [[0], [1], [2], [3], [4]]
    assert seen[0] == {"step": 1, "total_steps": 6, "epoch": 0, "loss": 0.0, "lr": 1.0,
                       "mine": 1.0, "tag": "x"}
    # every 2 steps, and once more where should_stop ended it (issue 32 item 1)
    assert [c["step"] for c in cks] == [2, 4, 5] and float(w.detach()) == 10.0
    w3, opt3, sched3, step3, state3 = _loop_parts()
    state3.load_state_dict(cks[-1])  # the stop: continues with the one batch left
    run_loop(step3, opt3, sched3, state3)
    assert step3.seen == [[5]] and float(w3.detach()) == 15.0
    w2, opt2, sched2, step2, state2 = _loop_parts()
    state2.load_state_dict(cks[0])  # step 2: mid-epoch 0
    assert float(w2.detach()) == 1.0 and len(state2.history) == 2
    run_loop(step2, opt2, sched2, state2)
    assert step2.seen == [[2], [3], [4], [5]] and float(w2.detach()) == 15.0 and not state2.stopped
    assert [h["step"] for h in state2.history] == [1, 2, 3, 4, 5, 6]


def test_summed_loss_weights_objectives_and_keeps_their_stats():
    """Σ weight · term over the objectives that apply; each keeps its own stats."""
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]], requires_grad=True)
    rec = torch.zeros(2, 3, 4)
    out = ModelOutput(logits, rec, torch.zeros(2, 1, 1))
    targets = torch.tensor([[0, 1, 2], [3, 3, 3]])
    task = TaskCE(torch.tensor([0, 0]))
    r = Reconstruction(targets, torch.tensor([1, 0]), weight=0.25)
    loss, stats = SummedLoss(lambda idx: out, [task, r])(torch.tensor([0, 1]))
    ce = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 0]), reduction="none")
    torch.testing.assert_close(loss, ce + 0.25 * torch.log(torch.tensor(4.0)))
    assert set(stats) == {"task_loss", "rec_loss", "rec_acc"}
    assert stats["rec_acc"].shape == (2, 3)
    no_rec = ModelOutput(logits, None, torch.zeros(2, 1, 1))
    loss2, stats2 = SummedLoss(lambda idx: no_rec, [task, r])(torch.tensor([0, 1]))
    torch.testing.assert_close(loss2, ce)
    assert set(stats2) == {"task_loss"}


def _padded(parts: list[torch.Tensor], lengths: list[int]) -> int:
    return sum(len(p) * max(lengths[i] for i in p.tolist()) for p in parts)


def test_length_split_pads_least_and_keeps_every_row_once():
    """Against every split of the sorted rows in one or two groups (the brute force)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 10, (1,), generator=g))
        lengths = torch.randint(3, 60, (20,), generator=g).tolist()
        idx = torch.randperm(20, generator=g)[:n]
        parts = length_split(idx, lengths)
        assert sorted(torch.cat(parts).tolist()) == sorted(idx.tolist())
        ls = sorted(lengths[i] for i in idx.tolist())
        best = min([n * ls[-1]] + [i * ls[i - 1] + (n - i) * ls[-1] for i in range(1, n)])
        assert _padded(parts, lengths) == best and len(parts) <= 2
    # short rows and long rows: two passes, far less padding than one
    parts = length_split(torch.arange(6), [5, 40, 6, 41, 5, 7])
    assert [sorted(p.tolist()) for p in parts] == [[0, 2, 4, 5], [1, 3]]


def test_mean_step_by_length_gives_the_batch_mean_gradient(tok):
    """Rows of very different lengths: the step in passes by length sets the same gradient and
    stats as one padded pass over the batch (mutations caught: a pass's loss divided by its
    own size, a pass left out, the stats of the last pass only)."""
    from rapt.tuning.tune import RaptModel, _loss_fn

    bb = make_bert(tok)
    texts = ["good", "the movie was good and fun and fine and great and long",
             "bad", "awful and boring", "fun", "the movie was long and boring and bad"]
    labels = [1, 1, 0, 0, 1, 0]
    rows = build_rows(tok, texts, 24, None)
    cfg = TuneConfig(method="prefix", num_virtual_tokens=3, seed=1)
    model = RaptModel(bb, cfg, 2).eval()  # no dropout: both runs see the same function
    loss_fn = _loss_fn(model, bb, rows, labels, cfg, [], None, None, "cpu")
    idx = torch.arange(len(rows))
    got = {}
    for name, lengths in (("one", None), ("by length", [len(r) for r in rows])):
        model.zero_grad()
        stats = MeanStep(loss_fn, len(rows), 6, 1, 0, lengths=lengths).compute(idx)
        got[name] = (model.tuner.prefix.grad.clone(), stats)
    assert len(length_split(idx, [len(r) for r in rows])) == 2
    torch.testing.assert_close(got["by length"][0], got["one"][0], rtol=1e-5, atol=1e-7)
    assert got["by length"][1] == pytest.approx(got["one"][1], rel=1e-5)


def _write() -> None:  # pragma: no cover - run by hand, see the module docstring
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        t = make_tokenizer(Path(d), TOY_WORDS)
        torch.save({n: _record(run_case(t, n)[0]) for n in CASES}, PIN)


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["--write"]:
        _write()
