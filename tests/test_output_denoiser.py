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
