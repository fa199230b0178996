"""The channel in the product (issue 27 item 5): `rapt adapt` builds a channel model from public
text; `rapt tune/predict --channel` denoise privatized rows before tuning and predict, record
the channel's provenance and refuse a mismatch; the channel model only ever reads privatized
text positions."""

from __future__ import annotations

import json
import random

import pytest
import torch
from _tiny import TOY_WORDS, make_bert, save_backbone
from typer.testing import CliRunner

from rapt.channel.denoiser import Denoiser, DenoiserConfig
from rapt.channel.model import channel_fingerprint
from rapt.cli import app
from rapt.config import TuneConfig
from rapt.models import load_backbone
from rapt.pipeline import Customization, Encoding

runner = CliRunner()
ETA = "120"


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(TOY_WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_tokenizer):
    """(backbone folder, public corpus file, labelled CSV, channel folder built by adapt,
    adapt's result) -- the adapt run is shared by the tests below."""
    tmp = tmp_path_factory.mktemp("channel_product")
    bb = save_backbone(make_bert(tiny_tokenizer, seed=3, max_positions=128), tmp / "bb")
    corpus = tmp / "public.txt"
    corpus.write_text("\n".join(_sentences(300, seed=0)) + "\n\n")
    csv = tmp / "reviews.csv"
    csv.write_text("text,label\n" + "".join(
        f"{t},{y}\n" for t, y in [("the movie was good and fun", 1), ("a very boring plot", 0),
                                  ("the story is fine", 1), ("the actor was bad", 0)] * 4))
    ch = tmp / "channel"
    r = runner.invoke(app, ["adapt", "--out", str(ch), "--backbone", str(bb), "--corpus",
                            str(corpus), "--eta", ETA, "--epochs", "2", "--lr", "1e-2",
                            "--max-length", "16", "--holdout", "20", "--noise-seed", "0",
                            "--json-report"])
    return bb, corpus, csv, ch, r


def test_adapt_saves_the_channel_with_provenance_and_prints_recovery(setup):
    bb, corpus, _, ch, r = setup
    assert r.exit_code == 0, r.output
    assert "nearest neighbour" in r.stdout and "denoiser" in r.stdout
    assert "held-out public texts" in r.stdout and "also an attacker" in r.stdout
    assert f"saved the channel model to {ch}" in r.stdout
    meta = json.loads((ch / "config.json").read_text())["meta"]
    assert meta["corpus"]["sources"][0]["name"] == str(corpus)
    assert meta["corpus"]["n_texts"] == 300  # the blank line is dropped
    assert meta["corpus"]["used_texts"] == 300 and meta["corpus"]["n_tokens"] > 300 * 3
    assert meta["train_rows"] == 300 - 20 and meta["rows"] == 280 and meta["tokens"] > 280 * 3
    assert meta["etas"] == [120.0] and meta["eta_band"] == [120.0, 120.0]
    assert 0.0 < meta["p"]["120"] < 1.0
    assert meta["seeded"] is True and meta["backbone"] == str(bb)
    (ev,) = meta["evaluation"]
    assert ev["held_out_rows"] == 20 and set(ev["recovery"]) == {"nearest neighbour",
                                                                  "denoiser"}
    assert ev["recovery"]["nearest neighbour"]["replaced"] == 0.0
    weaker = ev["recovery"]["denoiser"]["all"] < ev["recovery"]["nearest neighbour"]["all"]
    assert ("undertrained" in r.stderr) == weaker
    assert json.loads(r.stdout.strip().splitlines()[-1])["meta"]["train_rows"] == 280
    assert not [p for p in ch.parent.iterdir() if p.name.startswith(".")]  # no partial folder
    den = Denoiser.load(ch, load_backbone(str(bb)))
    assert den.config.max_length == 16


def test_adapt_errors_name_the_problem(setup, tmp_path):
    bb, corpus, _, ch, _ = setup
    base = ["adapt", "--backbone", str(bb), "--out", str(tmp_path / "x")]
    cases = [
        ([*base, "--eta", ETA], "exactly one of --corpus-for TASK or --corpus FILE"),
        ([*base, "--corpus", str(corpus)], "exactly one of --eta, --target-p, --eta-band"),
        ([*base, "--corpus", str(corpus), "--eta", ETA, "--eta-band", "10", "20", "3"],
         "got --eta, --eta-band"),
        ([*base, "--corpus", str(corpus), "--eta-band", "20", "10", "3"], "0 < LO <= HI"),
        ([*base, "--corpus", str(tmp_path / "none.txt"), "--eta", ETA], "no such file"),
        (["adapt", "--backbone", str(bb), "--out", str(ch), "--corpus", str(corpus), "--eta",
          ETA], "exists; pass --force"),
        ([*base, "--corpus-for", "nope", "--eta", ETA], "unknown evaluation task"),
    ]
    for argv, msg in cases:
        r = runner.invoke(app, argv)
        assert r.exit_code == 2 and msg in r.stderr, (argv, r.output)
        assert "Traceback" not in r.output


def test_adapt_interrupted_saves_nothing(setup, tmp_path, monkeypatch):
    bb, corpus, _, _, _ = setup
    out = tmp_path / "ch"
    argv = ["adapt", "--out", str(out), "--backbone", str(bb), "--corpus", str(corpus),
            "--eta", ETA, "--max-rows", "40", "--max-length", "16", "--holdout", "5"]

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:  # Ctrl-C while training
        m.setattr("rapt.channel.denoiser.train_denoiser", interrupt)
        r = runner.invoke(app, argv)
    assert r.exit_code == 130 and "nothing saved" in r.stderr
    assert list(tmp_path.iterdir()) == []

    real_save = Denoiser.save

    def save_then_interrupt(self, folder):
        real_save(self, folder)  # the tensors are written, then Ctrl-C
        raise KeyboardInterrupt

    with monkeypatch.context() as m:  # Ctrl-C while writing the folder
        m.setattr(Denoiser, "save", save_then_interrupt)
        r = runner.invoke(app, argv)
    assert r.exit_code == 130, r.output
    assert list(tmp_path.iterdir()) == []
    r = runner.invoke(app, argv)
    assert r.exit_code == 0 and (out / "config.json").is_file(), r.output


def _tune(setup, out, *extra):
    bb, _, csv, _, _ = setup
    return runner.invoke(app, ["tune", str(csv), "--out", str(out), "--backbone", str(bb),
                               "--eta", ETA, "--method", "prompt", "--num-virtual-tokens", "2",
                               "--epochs", "1", "--batch-size", "8", "--max-length", "32",
                               "--noise-seed", "1", *extra])


def test_tune_and_predict_with_channel_record_and_check_it(setup, tmp_path):
    bb, _, csv, ch, _ = setup
    art = tmp_path / "art"
    r = _tune(setup, art, "--channel", str(ch))
    assert r.exit_code == 0, r.output
    assert "channel: the channel model recovers" in r.stdout
    assert "an upper bound on privacy), set by" in r.stdout
    meta = json.loads((art / "config.json").read_text())["meta"]
    den = Denoiser.load(ch, load_backbone(str(bb)))
    assert meta["channel"]["path"] == str(ch)
    assert meta["channel"]["fingerprint"] == channel_fingerprint(den)
    assert meta["channel"]["provenance"]["corpus"]["sources"][0]["name"].endswith("public.txt")
    assert meta["channel"]["provenance"]["etas"] == [120.0]
    assert "post-processing" in meta["channel"]["note"].lower()
    measured = json.loads((tmp_path / "art.measured.NOT-PRIVATE.json").read_text())["privacy"]
    assert "channel" not in meta["privacy"]  # measured on the rows: beside the folder
    priv = measured["channel"]
    strongest = max(priv["recovery"], measured["inversion_success"])
    assert priv["empirical_privacy"] == pytest.approx(1 - strongest)
    assert priv["strongest_attacker"] == ("channel denoiser" if priv["recovery"] == strongest
                                          else "nearest neighbour")

    r = runner.invoke(app, ["predict", str(art), str(csv), "--channel", str(ch),
                            "--noise-seed", "2"])
    assert r.exit_code == 0, r.output
    assert "accuracy" in r.stdout and "channel: the channel model recovers" in r.stderr

    r = runner.invoke(app, ["predict", str(art), str(csv)])
    assert r.exit_code == 2 and "was tuned with the channel model" in r.stderr, r.output
    assert f"--channel {ch}" in r.stderr
    r = runner.invoke(app, ["predict", str(art), str(csv), "--allow-channel-mismatch"])
    assert r.exit_code == 0 and "warning: --allow-channel-mismatch" in r.stderr, r.output

    other = tmp_path / "other"
    with torch.no_grad():
        den.bias += 1.0
    den.save(other)
    r = runner.invoke(app, ["predict", str(art), str(csv), "--channel", str(other)])
    assert r.exit_code == 2 and "is not the channel model" in r.stderr, r.output

    plain = tmp_path / "plain"
    assert _tune(setup, plain).exit_code == 0
    assert json.loads((plain / "config.json").read_text())["meta"]["channel"] is None
    r = runner.invoke(app, ["predict", str(plain), str(csv), "--channel", str(ch)])
    assert r.exit_code == 2 and "tuned without a channel model" in r.stderr, r.output


def test_tune_channel_errors(setup, tmp_path):
    bb, _, csv, ch, _ = setup
    r = runner.invoke(app, ["tune", str(csv), "--backbone", str(bb), "--channel",
                            str(tmp_path), "--no-privacy"])
    assert r.exit_code == 2 and "leave out --no-privacy" in r.stderr, r.output
    r = _tune(setup, tmp_path / "a", "--channel", str(tmp_path / "missing"))
    assert r.exit_code == 2 and "--channel" in r.stderr and "missing" in r.stderr, r.output
    # Built on another backbone of the same shapes: refused, not loaded with a warning.
    den = Denoiser.load(ch, load_backbone(str(bb)))
    den.meta["backbone"] = "minilm"
    other = den.save(tmp_path / "other")
    r = _tune(setup, tmp_path / "b", "--channel", str(other))
    assert r.exit_code == 2 and f"--channel {other}" in r.stderr, r.output
    assert "built on backbone 'minilm'" in r.stderr and "rapt adapt --backbone" in r.stderr


TEXTS = ["the movie was good and fun", "a boring plot", "really great music", "the worst film",
         "it was a nice story", "dull and weak scene"] * 2
LABELS = [1, 0, 1, 0, 1, 0] * 2


def test_channel_reads_privatized_text_positions_only(tiny_bert):
    """The denoiser never receives original ids, nor the public plain tokens k or the specials:
    exactly the text positions of the privatized rows, at tune and at predict."""
    tok = tiny_bert.tokenizer
    den = Denoiser(tiny_bert, DenoiserConfig(max_length=32))
    seen: list[list[int]] = []
    inner = den.denoise

    def spy(rows, *a, **k):
        seen.extend([list(r) for r in rows])
        return [[tok.convert_tokens_to_ids("the")] * len(r) for r in rows]  # a visible mark

    den.denoise = spy
    enc = Encoding.sampled(tok, 32 + 4, 4, 1, len(TEXTS), seed=0)
    cfg = TuneConfig(method="prompt", num_virtual_tokens=2, lr=3e-2, epochs=1, batch_size=6,
                     max_length=36, head="linear", reconstruction=True)
    custom = Customization.create(tiny_bert, enc, cfg, eta=40.0, noise_seed=0,
                                  privatizer_mode="exact", channel=den)
    clean = custom.rows(TEXTS)
    private = custom.privatize(clean)
    assert all(r[0] == tok.cls_token_id and r[-1] == tok.sep_token_id for r in private)
    text = [r[1 + 4:-1] for r in private]  # [CLS] k x [SEP] -> x
    assert text != [r[1 + 4:-1] for r in clean]  # some replaced: originals would be told apart
    assert seen == text
    assert custom.privacy["channel"]["recovery"] < 1.0

    out = custom.denoise(private)
    mark = tok.convert_tokens_to_ids("the")
    for p, d in zip(private, out, strict=True):
        assert d[:1 + 4] == p[:1 + 4]  # [CLS] and the plain tokens k, as released
        assert d[-1] == p[-1] and set(d[5:-1]) == {mark}

    seen.clear()
    custom.tune(private, LABELS, 2)
    assert seen in ([], text)  # the release's denoising is reused, or redone on the same rows
    queries = custom.for_artifact(custom.artifact)
    q_clean = queries.rows(TEXTS[:3], queries=True)
    q_priv = queries.privatize(q_clean, measure=False)
    seen.clear()
    assert queries.predict_proba(q_priv).shape == (3, 2)
    assert seen == [r[1 + 4:-1] for r in q_priv] and seen != [r[1 + 4:-1] for r in q_clean]
    den.denoise = inner
    assert custom.privacy_meta()["channel"]["fingerprint"] == channel_fingerprint(den)


@pytest.fixture(scope="module")
def adapter_setup(setup, tmp_path_factory):
    """A channel adapter built by `rapt adapt --kind adapter` on the same backbone and corpus."""
    bb, corpus, _, _, _ = setup
    ch = tmp_path_factory.mktemp("adapter") / "ad"
    r = runner.invoke(app, ["adapt", "--kind", "adapter", "--out", str(ch), "--backbone",
                            str(bb), "--corpus", str(corpus), "--eta", ETA, "--epochs", "1",
                            "--max-length", "16", "--holdout", "20", "--noise-seed", "0"])
    return ch, r


def test_adapt_kind_adapter_saves_an_adapter_with_provenance(setup, adapter_setup):
    from rapt.channel.adapter import ChannelAdapter
    from rapt.channel.load import load_channel_model

    bb, corpus, _, _, _ = setup
    ch, r = adapter_setup
    assert r.exit_code == 0, r.output
    assert "held-out public texts" in r.stdout and "adapted cos" in r.stdout
    doc = json.loads((ch / "config.json").read_text())
    assert doc["format"] == "rapt-channel-adapter"
    meta = doc["meta"]
    assert meta["kind"] == "adapter" and meta["backbone"] == str(bb)
    assert meta["corpus"]["sources"][0]["name"] == str(corpus)
    assert meta["train_rows"] == 280 and meta["identity_rows"] == 56  # 20 % clean pairs
    assert meta["rows"] == 280 + 56 and meta["etas"] == [120.0] and meta["seeded"] is True
    (ev,) = meta["evaluation"]
    assert ev["held_out_rows"] == 20 and {"raw", "adapted"} <= set(ev)
    model = load_channel_model(ch, load_backbone(str(bb)))
    assert isinstance(model, ChannelAdapter) and model.config.max_length == 16
    r = runner.invoke(app, ["adapt", "--kind", "nope", "--out", str(ch.parent / "x"),
                            "--backbone", str(bb), "--corpus", str(corpus), "--eta", ETA])
    assert r.exit_code == 2 and "--kind must be denoiser or adapter" in r.stderr


def test_tune_and_predict_with_a_channel_adapter(setup, adapter_setup, tmp_path):
    """The prompt is tuned and predicts on the adapted backbone (rows as released); the
    artifact records the adapter and the public backbone's name; predict checks the adapter."""
    from rapt.channel.adapter import ChannelAdapter
    from rapt.tuning.tune import TunedPrompt

    bb, _, csv, den_folder, _ = setup
    ch, _ = adapter_setup
    art = tmp_path / "art"
    r = _tune(setup, art, "--channel", str(ch))
    assert r.exit_code == 0, r.output
    assert "channel: the channel model recovers" not in r.stdout  # an adapter outputs no tokens
    meta = json.loads((art / "config.json").read_text())["meta"]
    backbone = load_backbone(str(bb))
    ad = ChannelAdapter.load(ch, backbone)
    assert meta["backbone"] == str(bb)  # `rapt predict` loads this name
    assert meta["channel"]["fingerprint"] == channel_fingerprint(ad)
    assert meta["channel"]["provenance"]["kind"] == "adapter"

    r = runner.invoke(app, ["predict", str(art), str(csv), "--channel", str(ch),
                            "--noise-seed", "2", "--json-report"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["predict", str(art), str(csv), "--channel", str(den_folder)])
    assert r.exit_code == 2 and "is not the channel model" in r.stderr, r.output
    r = runner.invoke(app, ["predict", str(art), str(csv)])
    assert r.exit_code == 2 and "was tuned with the channel model" in r.stderr, r.output

    # Customization: the adapter changes the reader, never the rows.
    tuned = TunedPrompt.load(art)
    custom = Customization.from_artifact(backbone, tuned, eta=None, channel=ad)
    assert custom.reader is ad.adapted_backbone(backbone) and custom.reader is not backbone
    rows = custom.rows(["the movie was good", "a very boring plot"], queries=True)
    assert custom.denoise(rows) == rows
    got = custom.predict_proba(rows)
    assert torch.allclose(got, tuned.predict_proba(custom.reader, rows))
    assert not torch.allclose(got, tuned.predict_proba(backbone, rows), atol=1e-6)
