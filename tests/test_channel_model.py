"""The channel model's interface: a customization asks any channel model for its prepared rows
and its reader (no branch on what kind it is), and every caller loads one through the same
backbone rule (the backbone it was built on, by name or weights folder, and by width)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _tiny import stub_channel_model

from rapt.artifacts import ArtifactError
from rapt.channel.denoiser import Denoiser, DenoiserConfig
from rapt.channel.load import load_channel_model
from rapt.channel.model import BackboneMismatch, channel_fingerprint
from rapt.config import TuneConfig
from rapt.pipeline import Customization, Encoding


def _save(bb, folder: Path, **meta) -> Path:
    den = Denoiser(bb, DenoiserConfig(max_length=16, seed=1),
                   meta={"hidden_size": bb.hidden_size, **meta})
    return den.save(folder)


def test_a_channel_model_loads_only_on_the_backbone_it_was_built_on(tiny_bert, tmp_path):
    ok = _save(tiny_bert, tmp_path / "ok", backbone=tiny_bert.name)
    assert isinstance(load_channel_model(ok, tiny_bert), Denoiser)
    # Same shapes, another backbone's name: refused (it used to load with a warning).
    other = _save(tiny_bert, tmp_path / "other", backbone="other-bert")
    with pytest.raises(BackboneMismatch, match="built on backbone 'other-bert', not on "
                       f"'{tiny_bert.name}'.*rapt adapt --backbone {tiny_bert.name}"):
        load_channel_model(other, tiny_bert)
    with pytest.raises(BackboneMismatch, match="config.json"):
        Denoiser.load(other, tiny_bert)  # the class's own load keeps the same rule
    # The name the caller knows the backbone by (the service's --backbone name) counts.
    assert isinstance(load_channel_model(other, tiny_bert, name="other-bert"), Denoiser)
    nameless = _save(tiny_bert, tmp_path / "nameless")
    with pytest.raises(BackboneMismatch, match="records no backbone"):
        load_channel_model(nameless, tiny_bert)
    # A mismatch is an ArtifactError (a ValueError): callers name the folder and exit 2.
    assert issubclass(BackboneMismatch, ArtifactError) and issubclass(BackboneMismatch,
                                                                      ValueError)


def test_a_backbone_folder_and_its_name_are_the_same_backbone(tiny_bert, tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    ch = _save(tiny_bert, tmp_path / "ch", backbone=str(folder))
    assert isinstance(load_channel_model(ch, tiny_bert, name=f"{folder}/."), Denoiser)


def test_the_demo_refuses_a_channel_of_another_backbone(tiny_bert, tmp_path):
    from rapt.demo import DemoConfig, _load_channel

    other = _save(tiny_bert, tmp_path / "other", backbone="other-bert")
    with pytest.raises(ValueError, match=f"channel {other}: .*built on backbone 'other-bert'"):
        _load_channel(DemoConfig(channel=str(other)), tiny_bert)


class _Reversing(stub_channel_model()):
    """Neither a denoiser nor an adapter: it reverses each row's text and reads with its own
    backbone. The customization must use it through the interface alone."""

    remedy = attacker = "reversal"

    def __init__(self, reader_backbone, config, meta):
        self.reader_backbone, self.config, self.meta = reader_backbone, config, meta
        self.seen: list | None = None

    def prepare_rows(self, texts):
        self.seen = [list(t) for t in texts]
        return [list(reversed(t)) for t in texts]

    def reader(self, backbone):
        return self.reader_backbone

    def trained_tensors(self):
        return {"w": torch.zeros(2)}


def test_customization_asks_the_interface_not_a_role(tiny_bert):
    from dataclasses import replace

    other = replace(tiny_bert, name="reader")
    ch = _Reversing(other, DenoiserConfig(), {"backbone": tiny_bert.name})
    custom = Customization.create(tiny_bert, Encoding(16), TuneConfig(method="prompt"),
                                  eta=50.0, noise_seed=0, channel=ch)
    assert custom.reader is other
    rows = custom.rows(["a good movie", "the plot was boring"])
    text = [r[1:-1] for r in rows]  # [CLS] text [SEP]
    out = custom.denoise(rows)
    assert ch.seen == text  # only the text positions went in; the specials stay as released
    assert out == [[r[0], *reversed(t), r[-1]] for r, t in zip(rows, text, strict=True)]
    custom.privatize(rows)
    assert custom.privacy["channel"]["attacker"] == "reversal"
    assert custom.channel_meta()["fingerprint"] == channel_fingerprint(ch)
