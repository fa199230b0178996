"""The user-side output denoiser (rapt.local.denoise) and the pooled states it reads
(TunedPrompt.pooled / head_proba)."""

from __future__ import annotations

import pytest
import torch

from rapt.config import TuneConfig
from rapt.local.denoise import OutputDenoiser, fit_denoiser, token_features
from rapt.pipeline import Customization, Encoding


def test_token_features_are_the_means_the_docstring_names():
    emb = torch.arange(12, dtype=torch.float32).reshape(6, 2)  # token t -> (2t, 2t + 1)
    special = [0, 1]
    clean = [[0, 2, 3, 4, 1]]
    released = [[0, 2, 5, 4, 1]]  # token 3 replaced by 5
    f = token_features(emb, clean, released, special)
    h = 2
    assert torch.allclose(f[0, :h], emb[[2, 3, 4]].mean(0))
    assert torch.allclose(f[0, h:2 * h], emb[[2, 5, 4]].mean(0))
    assert torch.allclose(f[0, 2 * h:3 * h], emb[3])
    assert f[0, -1].item() == pytest.approx(1 / 3)
    same = token_features(emb, clean, clean, special)
    assert same[0, 2 * h:3 * h].abs().sum() == 0 and same[0, -1] == 0
    with pytest.raises(ValueError, match="row 0"):
        token_features(emb, [[2, 3]], [[2]], special)


def test_an_untrained_denoiser_is_the_identity():
    den = OutputDenoiser(8)
    z = torch.randn(5, 8)
    assert torch.equal(den(z, torch.randn(5, 3 * 8 + 1)), z)


def test_fit_learns_a_correction_the_features_carry():
    """clean = private + W · (clean-token mean − released mean): only the features say how
    far the state moved, so a denoiser that ignores them cannot fit it."""
    g = torch.Generator().manual_seed(0)
    n, h = 2000, 8
    c, r = torch.randn(n, h, generator=g), torch.randn(n, h, generator=g)
    feats = torch.cat([c, r, torch.zeros(n, h), torch.rand(n, 1, generator=g)], -1)
    zp = torch.randn(n, h, generator=g)
    w = torch.randn(h, h, generator=g) / h ** 0.5
    zc = zp + (c - r) @ w
    den, fit = fit_denoiser(zp, feats, zc, epochs=40, seed=0)
    assert min(fit.after) < 0.2 * fit.before
    with torch.no_grad():
        err = ((den(zp, feats) - zc) ** 2).sum(-1).mean()
    assert err < 0.3 * ((zp - zc) ** 2).sum(-1).mean()


@pytest.mark.parametrize("head", ["linear", "label-description"])
def test_head_on_pooled_states_equals_predict_proba(tiny_bert, head):
    texts = ["the movie was good", "a bad plot", "great fun", "dull story"] * 4
    labels = [1, 0, 1, 0] * 4
    extra = {"label_descriptions": ["bad", "good"]} if head == "label-description" else {}
    cfg = TuneConfig(method="lora", epochs=1, batch_size=8, max_length=16, head=head, **extra)
    custom = Customization.create(tiny_bert, Encoding(16), cfg)
    rows = custom.rows(texts)
    tuned = custom.tune(rows, labels, 2)
    pooled = tuned.pooled(tiny_bert, rows)
    assert pooled.shape == (len(rows), tiny_bert.hidden_size)
    torch.testing.assert_close(tuned.head_proba(tiny_bert, pooled),
                               tuned.predict_proba(tiny_bert, rows))


# -- fitting it on public text, running it on queries, saving it (rapt.pipeline, artifacts) --

PUBLIC = ["good fun film", "bad boring plot", "great music", "awful story", "a good story",
          "the plot was dull", "fun music and a great film", "boring and awful"] * 8


@pytest.fixture()
def tuned_custom(tiny_bert):
    """(privatized Customization with its tuned LoRA prompt, clean query rows, their
    privatized copies)."""
    texts = ["the movie was good", "a bad plot", "great fun", "dull story"] * 4
    cfg = TuneConfig(method="lora", epochs=1, batch_size=8, max_length=16)
    custom = Customization.create(tiny_bert, Encoding(16), cfg, eta=5.0, noise_seed=0)
    custom.tune(custom.privatize(custom.rows(texts)), [1, 0, 1, 0] * 4, 2)
    q = custom.for_artifact(custom.artifact)
    clean = q.rows(texts[:6], queries=True)
    return custom, clean, q.privatize(clean, measure=False)


def test_fit_output_denoiser_reads_public_text_only_and_records_it(tuned_custom):
    from rapt.pipeline import fit_output_denoiser

    custom, _, _ = tuned_custom
    seen = []
    den, rec = fit_output_denoiser(custom, custom.artifact, PUBLIC, rows=40, epochs=3,
                                   progress=lambda d, t: seen.append((d, t)))
    assert isinstance(den, OutputDenoiser) and den.hidden == custom.backbone.hidden_size
    assert rec["public_rows"] == 40 and rec["privatized_copies"] == 2 and rec["eta"] == 5.0
    assert rec["trained_on"] == {"kind": "public text", "n_texts": len(PUBLIC)}
    assert len(rec["curve"]) == 3 and rec["after"] == min([rec["before"], *rec["curve"]])
    assert seen[-1] == (8, 8) and [d for d, _ in seen] == list(range(1, 9))  # 5 stages + 3
    clean = Customization.create(custom.backbone, Encoding(16))
    with pytest.raises(ValueError, match="privatizes nothing"):
        fit_output_denoiser(clean, custom.artifact, PUBLIC)


def test_denoised_proba_is_the_head_on_the_corrected_state(tuned_custom):
    from rapt.pipeline import denoised_proba

    custom, clean, priv = tuned_custom
    tuned, bb = custom.artifact, custom.backbone
    identity = OutputDenoiser(bb.hidden_size)
    torch.testing.assert_close(denoised_proba(custom, tuned, identity, clean, priv),
                               tuned.predict_proba(bb, priv))
    shift = OutputDenoiser(bb.hidden_size)
    with torch.no_grad():
        shift.net[-1].bias.fill_(3.0)  # every corrected state moves by 3 in each coordinate
    got = denoised_proba(custom, tuned, shift, clean, priv)
    want = tuned.head_proba(bb, tuned.pooled(bb, priv) + 3.0)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, tuned.predict_proba(bb, priv))


def test_the_held_out_slice_is_scored_through_the_denoiser(tuned_custom, monkeypatch):
    """The fusion weights are fitted on what `rapt predict` will fuse: the denoised remote
    probabilities of the slice's rows privatized as queries."""
    import numpy as np

    import rapt.pipeline.user_side as pl

    custom, _, _ = tuned_custom
    calls = []

    def spy(c, tuned, den, clean, priv):
        calls.append((den, len(clean), len(priv)))
        return torch.full((len(priv), 2), 0.5)

    monkeypatch.setattr(pl, "denoised_proba", spy)
    texts = ["good fun", "bad plot", "great music", "awful story"] * 10
    labels = [1, 0, 1, 0] * 10
    marker = OutputDenoiser(custom.backbone.hidden_size)
    pl.user_side_after_tune(custom, texts, labels, 2, np.arange(8), denoiser=marker)
    assert calls == [(marker, 8, 8)]
    calls.clear()
    pl.user_side_after_tune(custom, texts, labels, 2, np.arange(8))
    assert calls == []


def test_the_output_denoiser_is_saved_inside_out_with_its_prompt(tuned_custom, tmp_path):
    from rapt.artifacts import (
        ArtifactError,
        read_output_denoiser,
        remove_output_denoiser,
        write_output_denoiser,
    )

    custom, _, _ = tuned_custom
    out = tmp_path / "run"
    custom.artifact.save(out)
    assert read_output_denoiser(out) is None
    den = OutputDenoiser(custom.backbone.hidden_size, width=16)
    with torch.no_grad():
        den.net[-1].bias.fill_(0.5)
    write_output_denoiser(out, den, {"eta": 5.0, "public_rows": 40})
    got, doc = read_output_denoiser(out)
    assert doc["record"] == {"eta": 5.0, "public_rows": 40} and "public text" in doc["note"]
    for k, v in den.state_dict().items():
        assert torch.equal(got.state_dict()[k], v)
    assert (out / "output_denoiser.json").stat().st_mode & 0o044  # shareable, not 0600
    custom.artifact.tensors[next(iter(custom.artifact.tensors))].add_(1.0)
    custom.artifact.save(out)  # another prompt in the same folder
    with pytest.raises(ArtifactError, match="another prompt"):
        read_output_denoiser(out)
    assert [p.name for p in remove_output_denoiser(out)] == ["output_denoiser.json",
                                                             "output_denoiser.safetensors"]
    assert read_output_denoiser(out) is None


def test_the_public_corpus_excludes_the_task_and_covers_every_family_for_a_file(shared_data):
    from rapt.pipeline import output_denoiser_corpus

    sst = output_denoiser_corpus("sst2")
    assert sst.disjoint_from == "sst2"
    assert "sst2-sentences" not in {s["name"] for s in sst.sources}
    user = output_denoiser_corpus("my_reviews.csv")
    assert user.disjoint_from == "user"
    assert {s["name"] for s in user.sources} == {"sst2-sentences", "financial_phrasebank",
                                                 "trec", "cb", "trustpilot"}


def test_pooled_states_in_chunks_are_the_states_in_one_pass(tuned_custom, monkeypatch):
    import rapt.pipeline.user_side as pl

    custom, _, _ = tuned_custom
    monkeypatch.setattr(pl, "OUTPUT_DENOISER_CHUNK", 16)
    q = custom.for_artifact(custom.artifact)
    rows = q.rows(PUBLIC[:40], queries=True)
    steps = []
    torch.testing.assert_close(pl._pooled(q, rows, lambda: steps.append(1)), pl._pooled(q, rows))
    assert len(steps) == 3
    seen = []
    pl.fit_output_denoiser(custom, custom.artifact, PUBLIC, rows=40, epochs=2,
                           progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (13, 13)  # 3 chunks clean, 2 x (privatize + 3 chunks), 2 epochs


def test_privatizing_the_public_rows_is_reported_by_chunk(tuned_custom, monkeypatch):
    """Old behaviour: each privatized copy of the public rows was one step, the slowest of
    all (732 s of a 3,000-row fit on 2 loaded cores, against 10-80 s for the others), so the
    bar stood still and its rate promised nothing true; now every PRIVATIZE_CHUNK rows is a
    step."""
    import rapt.pipeline.customization as pc
    import rapt.pipeline.user_side as pl

    custom, _, _ = tuned_custom
    monkeypatch.setattr(pl, "OUTPUT_DENOISER_CHUNK", 16)
    monkeypatch.setattr(pl, "PRIVATIZE_CHUNK", 16, raising=False)
    monkeypatch.setattr(pc, "PRIVATIZE_CHUNK", 16)
    seen = []
    pl.fit_output_denoiser(custom, custom.artifact, PUBLIC, rows=40, epochs=2,
                           progress=lambda d, t: seen.append((d, t)))
    # 3 chunks clean, 2 x (3 chunks privatized + 3 read), 2 epochs: one step each
    assert seen == [(d, 17) for d in range(1, 18)]
