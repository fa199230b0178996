"""The one trainer on tiny random backbones: learning, repeatability, artifacts, resume."""

from __future__ import annotations

import pytest
import torch
from _tiny import TOY_WORDS, make_bert, make_llama, make_tokenizer

from rapt.reconstruction import build_rows, sample_plain_tokens
from rapt.trainer import TuneConfig, TunedPrompt, tune
from rapt.tuners import METHODS

POS, NEG = ["good", "great", "fun", "fine"], ["bad", "awful", "boring", "long"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("trainer_tok"), TOY_WORDS)


_bert, _llama = make_bert, make_llama


@pytest.fixture(params=["bert", "llama"])
def bb(request, tok):
    return _bert(tok) if request.param == "bert" else _llama(tok)


def _toy(n: int = 48):
    g = torch.Generator().manual_seed(0)
    texts, labels = [], []
    for i in range(n):
        y = i % 2
        words = POS if y else NEG
        w = words[int(torch.randint(len(words), (1,), generator=g))]
        texts.append(f"the movie was {w} and it was {w}")
        labels.append(y)
    return texts, labels


LR = {"prompt": 3e-2, "prefix": 3e-2, "lora": 1e-2, "full": 3e-3}


@pytest.mark.parametrize("method", METHODS)
def test_loss_decreases(bb, method):
    texts, labels = _toy()
    rows = build_rows(bb.tokenizer, texts, 32)
    cfg = TuneConfig(method=method, num_virtual_tokens=4, lr=LR[method], epochs=6,
                     batch_size=16, warmup_ratio=0.0)
    out = tune(bb, rows, labels, 2, cfg)
    h = out.meta["history"]
    first = sum(r["loss"] for r in h[:3]) / 3
    last = sum(r["loss"] for r in h[-3:]) / 3
    assert last < first - 0.02, (first, last)


def test_reconstruction_learns_plain_tokens_and_is_discarded(bb):
    texts, labels = _toy()
    plain = sample_plain_tokens(bb.tokenizer, 5, seed=0)
    rows = build_rows(bb.tokenizer, texts, 32, plain)
    cfg = TuneConfig(method="prefix", num_virtual_tokens=4, lr=3e-2, epochs=6, batch_size=16,
                     reconstruction=True, rec_hidden=16, rec_vocab_size=20)
    out = tune(bb, rows, labels, 2, cfg, plain_ids=plain)
    h = out.meta["history"]
    assert h[-1]["rec_loss"] < h[0]["rec_loss"] - 0.3
    assert h[-1]["rec_acc"] > h[0]["rec_acc"]
    assert not any(k.startswith("rec_head") for k in out.tensors)
    assert out.meta["plain_ids"] == plain and out.meta["plain_len"] == 5
    assert out.meta["plain_offset"] == 1  # after [CLS]


def test_several_plain_sequences(tok):
    bb = _bert(tok)
    texts, labels = _toy(16)
    seqs = sample_plain_tokens(tok, 3, seed=0, num_sequences=2)
    index = [i % 2 for i in range(16)]
    rows = build_rows(tok, texts, 32, seqs, index)
    assert rows[1][1:4] == seqs[1] and rows[0][1:4] == seqs[0]
    cfg = TuneConfig(method="prompt", num_virtual_tokens=2, epochs=1, batch_size=8,
                     reconstruction=True, rec_vocab_size=10)
    out = tune(bb, rows, labels, 2, cfg, plain_ids=seqs, plain_index=index)
    assert out.meta["plain_ids"] == seqs
    with pytest.raises(ValueError, match="plain_index"):
        tune(bb, rows, labels, 2, cfg, plain_ids=seqs)


@pytest.mark.parametrize("method", METHODS)
def test_repeatable_and_save_load_identical_predictions(bb, method, tmp_path):
    texts, labels = _toy(24)
    rows = build_rows(bb.tokenizer, texts, 32)
    cfg = TuneConfig(method=method, num_virtual_tokens=3, lr=LR[method], epochs=2,
                     batch_size=8, seed=5)
    a = tune(bb, rows, labels, 2, cfg)
    b = tune(bb, rows, labels, 2, cfg)
    for k in a.tensors:
        assert torch.equal(a.tensors[k], b.tensors[k]), k
    a.meta["eta"] = 12.5
    a.save(tmp_path / "p")
    loaded = TunedPrompt.load(tmp_path / "p")
    assert loaded.config == a.config and loaded.meta["eta"] == 12.5
    torch.testing.assert_close(loaded.predict_proba(bb, rows), a.predict_proba(bb, rows),
                               rtol=0, atol=0)


def test_verbalizer_for_causal(tok):
    bb = _llama(tok)
    texts, labels = _toy(24)
    rows = build_rows(tok, texts, 32)
    cfg = TuneConfig(method="prompt", num_virtual_tokens=3, lr=3e-2, epochs=3, batch_size=8,
                     label_words=["bad", "good"])
    out = tune(bb, rows, labels, 2, cfg)
    assert not any(k.startswith("head.") for k in out.tensors)  # the LM head is borrowed
    assert out.predict_proba(bb, rows).shape == (24, 2)
    with pytest.raises(ValueError, match="first token"):
        tune(bb, rows, labels, 2, TuneConfig(label_words=["good", "good"]))


def test_progress_stop_checkpoint_resume(tok):
    bb = _bert(tok)
    texts, labels = _toy(32)
    rows = build_rows(tok, texts, 32)
    cfg = TuneConfig(method="prefix", num_virtual_tokens=3, lr=1e-2, epochs=4, batch_size=8,
                     seed=1)
    seen, states = [], []
    full = tune(bb, rows, labels, 2, cfg, progress=seen.append, checkpoint=states.append)
    assert [r["step"] for r in seen] == list(range(1, 17))
    assert seen[0]["total_steps"] == 16 and {"loss", "epoch", "lr"} <= set(seen[0])
    assert len(states) == 4  # one per epoch

    stop_after = iter(range(100))
    part = tune(bb, rows, labels, 2, cfg, should_stop=lambda: next(stop_after) >= 6,
                checkpoint=states.append)
    assert part.meta["stopped"] and part.meta["steps"] == 6
    resumed = tune(bb, rows, labels, 2, cfg, resume=states[1])  # after epoch 2 of the full run
    for k in full.tensors:
        torch.testing.assert_close(resumed.tensors[k], full.tensors[k], rtol=0, atol=0)


def test_bad_inputs(tok):
    bb = _bert(tok)
    with pytest.raises(ValueError, match="no training examples"):
        tune(bb, [], [], 2, TuneConfig())
    with pytest.raises(ValueError, match="outside"):
        tune(bb, [[2, 5, 3]], [4], 2, TuneConfig())
    with pytest.raises(ValueError, match="plain_ids"):
        tune(bb, [[2, 5, 3]], [1], 2, TuneConfig(reconstruction=True))
    with pytest.raises(ValueError, match="method"):
        TuneConfig(method="adapterz")
    with pytest.raises(ValueError, match="lr"):
        TuneConfig(lr=0)


def test_load_errors_name_the_file(tmp_path):
    from rapt.artifacts import ArtifactError

    with pytest.raises(ArtifactError, match="missing"):
        TunedPrompt.load(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "prompt.safetensors").write_bytes(b"")
    with pytest.raises(ArtifactError, match="config.json: line 1"):
        TunedPrompt.load(tmp_path)


@pytest.mark.integration
def test_cli_tune_then_predict_minilm(tmp_path):
    """User CSV -> `rapt tune` (local privatization + RAPT) -> artifact -> `rapt predict`."""
    from typer.testing import CliRunner

    from rapt.cli import app

    csv = tmp_path / "reviews.csv"
    lines = ["text,label"] + [f"{w} film,{'pos' if w in POS else 'neg'}"
                              for w in (POS + NEG) * 2]
    csv.write_text("\n".join(lines) + "\n")
    art = tmp_path / "prompt"
    r = CliRunner().invoke(app, ["tune", str(csv), "--out", str(art), "--method", "prefix",
                                 "--eta", "80", "--epochs", "1", "--batch-size", "8",
                                 "--max-length", "24", "--plain-len", "4",
                                 "--num-virtual-tokens", "2"])
    assert r.exit_code == 0, r.output
    loaded = TunedPrompt.load(art)
    assert loaded.meta["eta"] == 80 and loaded.meta["label_names"] == ["neg", "pos"]
    assert loaded.meta["plain_len"] == 4 and loaded.config.reconstruction
    preds = tmp_path / "preds.jsonl"
    r = CliRunner().invoke(app, ["predict", str(art), str(csv), "--split", "train",
                                 "--out", str(preds)])
    assert r.exit_code == 0, r.output
    assert "accuracy" in r.output and len(preds.read_text().splitlines()) == 16
    r = CliRunner().invoke(app, ["predict", str(tmp_path / "nope"), str(csv)])
    assert r.exit_code == 2 and "missing" in r.output
