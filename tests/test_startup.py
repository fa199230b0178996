"""Start-up: `rapt --help` imports neither torch nor transformers, and `rapt privatize` reads
the tokenizer and the embedding matrix only (the mechanism needs no model), without
transformers' modeling code; the matrix is the one the full model holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from _tiny import TOY_WORDS, make_bert, make_tokenizer, save_backbone

from rapt.models import load_backbone, load_embeddings

SRC = Path(__file__).resolve().parents[1] / "src"


def _run(code: str, *args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                       text=True, cwd=cwd, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


CLI = ("import sys\nsys.argv = ['rapt', *sys.argv[1:]]\nfrom rapt.cli import main\n"
       "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
       "print(sorted(m for m in ('torch', 'transformers', 'transformers.modeling_utils')"
       " if m in sys.modules))")


def test_help_imports_neither_torch_nor_transformers():
    assert _run(CLI, "--help").splitlines()[-1] == "[]"


def test_the_store_and_its_private_file_writer_import_no_torch():
    """`rapt keys` opens the service's store, which writes its files with the one
    ``rapt.artifacts.write_private``: neither module may pull in torch or safetensors."""
    code = ("import sys\nimport rapt.service.store, rapt.artifacts\n"
            "print(sorted(m for m in ('torch', 'safetensors') if m in sys.modules))")
    assert _run(code).splitlines()[-1] == "[]"


def test_privatize_loads_no_model(tmp_path):
    bb = make_bert(make_tokenizer(tmp_path, TOY_WORDS))
    folder = save_backbone(bb, tmp_path / "bb")
    light = load_embeddings(str(folder))
    assert light.model is None and torch.equal(light.embeddings, bb.embeddings)
    assert light.embeddings.dtype == torch.float32 and light.hidden_size == 32
    assert light.special_ids == load_backbone(str(folder)).special_ids
    src = tmp_path / "in.txt"
    src.write_text("the movie was good\nbad plot and boring film\n")
    # uniform noise: the default's Presidio imports transformers.modeling_utils (its stanza
    # engine; 1.4 s), though no model is loaded
    out = _run(CLI, "privatize", str(src), str(tmp_path / "out.txt"), "--backbone",
               str(folder), "--eta", "50", "--protect", "all", cwd=tmp_path)
    assert out.splitlines()[-1] == "['torch', 'transformers']", out
    assert len((tmp_path / "out.txt").read_text().splitlines()) == 2


def test_an_unclear_layout_loads_the_whole_model(tmp_path):
    bb = make_bert(make_tokenizer(tmp_path, TOY_WORDS))
    folder = save_backbone(bb, tmp_path / "bb")
    from safetensors.torch import save_file

    # a second tensor that looks like the embedding matrix: which one it is, is unclear
    save_file({"other.word_embeddings.weight": torch.zeros_like(bb.embeddings)},
              str(folder / "extra.safetensors"))
    light = load_embeddings(str(folder))
    assert light.model is not None and torch.equal(light.embeddings, bb.embeddings)


def test_privatize_search_threads_follow_the_free_cores(monkeypatch):
    """Threads on cores other processes hold make the search wait (5-17x slower measured on 2
    shared cores): without OMP_NUM_THREADS, the search uses the cores the load leaves free."""
    import rapt.cli.privatize_cmd as pc

    calls = []
    threads = {"n": 2}
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads["n"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n) or threads.update(n=n))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.6, 1.0, 1.0))
    assert pc._threads_for_load() == 1 and calls == [1]
    threads["n"] = 2
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 1.0, 1.0))
    assert pc._threads_for_load() == 2  # a quiet machine: every core
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 1.0, 1.0))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    calls.clear()
    assert pc._threads_for_load() == 2 and calls == []  # the user's choice stands
