"""What every benchmark shares: where results go, the machine a result was measured on, the
command that reproduces it, and the writers of its json / md / png files."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def machine(**extra) -> dict:
    """The machine a result was measured on, with one set of keys for every benchmark.
    ``threads`` is torch's thread count in this process: call it after ``torch.set_num_threads``,
    or name the threads of the processes the benchmark times (``threads=``). ``extra`` adds
    what one benchmark also depends on (e.g. ``native_bf16``) or overrides a key;
    ``loadavg_end`` is added by the caller when the run ends."""
    import torch

    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "loadavg_start": list(os.getloadavg()), **extra}


# The keys of results files written before the benchmarks shared machine(), and theirs now.
_OLD_KEYS = {"torch_threads": "threads", "cpus": "cpu_count", "omp_threads": "omp_num_threads",
             "load_avg_start": "loadavg_start", "load_avg_end": "loadavg_end"}


def machine_of(doc: dict) -> dict:
    """A results file's ``machine`` in :func:`machine`'s keys, also when the file was written
    before every benchmark used it (``torch_threads``, ``cpus``, ``load_avg_start`` ...)."""
    m = dict(doc["machine"])
    for old, new in _OLD_KEYS.items():
        if old in m:
            m.setdefault(new, m.pop(old))
    return m


def command() -> str:
    """The command line that reruns this benchmark from the repository root."""
    module = Path(sys.argv[0]).resolve()
    name = (f"benchmarks.{module.stem}" if module.parent == ROOT / "benchmarks"
            else str(sys.argv[0]))
    return " ".join(["python -m", name, *map(shlex.quote, sys.argv[1:])])


def write_json(path: Path, doc, indent: int = 2, ensure_ascii: bool = True) -> Path:
    """``doc`` as indented json, ending in a newline."""
    path.write_text(json.dumps(doc, indent=indent, ensure_ascii=ensure_ascii) + "\n")
    return path


def write_md(path: Path, text: list[str] | str) -> Path:
    """A markdown report: its lines (joined, ending in a newline) or its text as it is."""
    path.write_text(text if isinstance(text, str) else "\n".join(text) + "\n")
    return path


def save_png(fig, path: Path, dpi: int = 120) -> Path:
    """A matplotlib figure as png."""
    fig.savefig(path, dpi=dpi)
    return path
