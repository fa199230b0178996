"""Wall-clock start-up of the commands a new user types first: `rapt --help`, `rapt privatize`
on 10 rows and `rapt predict` on 10 rows (a tiny prompt tuned here first, on the same rows, in a
temporary folder), each run ``--repeats`` times in a fresh process; the median is reported.

It runs the CLI of the source tree given with ``--src`` (its ``src`` folder on PYTHONPATH), so
one command measures an old commit and the new one on the same machine, e.g.

    git worktree add /tmp/rapt-old OLD_COMMIT
    python -m benchmarks.startup --src /tmp/rapt-old --label before
    python -m benchmarks.startup --src . --label after

Each run is stored under its label in ``benchmarks/results/startup.json`` (other labels are
kept), with the machine, the tree's commit and the load average at start and end, and
``startup.md`` gets one column per label. Time on a loaded machine says little: check the
load average in the JSON before comparing labels. The script uses no rapt API itself, only
the command line, so it measures any commit the same way.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import RESULTS

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "sst2" / "dev.tsv"
RUN_CLI = "import sys; sys.argv[0] = 'rapt'; from rapt.cli import main; sys.exit(main())"


def _rows(path: Path, n: int = 10) -> list[tuple[str, str]]:
    """The first ``n`` (sentence, label) rows of a GLUE SST-2 TSV file (public data)."""
    with path.open(encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:n + 1]
    return [(r[0], r[1]) for r in rows]


def _cli(python: str, src: Path, args: list[str], env: dict, cwd: Path) -> tuple[float, str, int]:
    """(seconds, output, exit code) of one `rapt ARGS` run in a fresh process."""
    t = time.perf_counter()
    p = subprocess.run([python, "-c", RUN_CLI, *args], cwd=cwd, env=env, capture_output=True,
                       text=True)
    return time.perf_counter() - t, p.stdout + p.stderr, p.returncode


def _commit(src: Path) -> str | None:
    p = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    return p.stdout.strip() or None


def _machine(threads: str | None) -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), platform.processor())
    return {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(),
            "omp_num_threads": threads, "python": sys.version.split()[0]}


def measure(src: Path, python: str, repeats: int, backbone: str, data: Path,
            threads: str | None, warm_cache: bool = False) -> dict:
    """Median and every time of the three commands, with the tiny model built first. Each
    measured process gets an empty ``$RAPT_CACHE`` (a first use: η calibrated, nothing cached)
    unless ``warm_cache``, where the runs share one cache that the tiny model's tune filled."""
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    with tempfile.TemporaryDirectory(prefix="rapt-startup-") as tmp:
        work = Path(tmp)
        env["RAPT_CACHE"] = str(work / "cache")
        texts = work / "texts.csv"
        with texts.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows(_rows(data))
        bb = ["--backbone", backbone]
        tune = ["tune", str(texts), "--out", str(work / "model"), *bb, "--eta", "100",
                "--method", "prompt", "--epochs", "1", "--batch-size", "5",
                "--num-virtual-tokens", "2", "--noise-seed", "0"]
        secs, out, code = _cli(python, src, tune, env, work)
        if code != 0:
            raise SystemExit(f"building the tiny model failed ({secs:.1f} s):\n{out}")
        commands = {
            "rapt --help": ["--help"],
            "rapt privatize (10 rows)": ["privatize", str(texts), str(work / "priv.csv"), *bb],
            "rapt predict (10 rows)": ["predict", str(work / "model"), str(texts)],
        }
        runs: dict[str, list[float]] = {}
        for name, args in commands.items():
            runs[name] = []
            for i in range(repeats):
                run_env = env if warm_cache else {**env, "RAPT_CACHE": str(work / f"cold{i}")}
                secs, out, code = _cli(python, src, args, run_env, work)
                if code != 0:
                    raise SystemExit(f"{name} failed:\n{out}")
                runs[name].append(round(secs, 3))
                print(f"{name}: {secs:.2f} s", file=sys.stderr, flush=True)
    return {name: {"median_s": round(statistics.median(t), 3), "runs_s": t}
            for name, t in runs.items()}


def write(label: str, record: dict, results: Path = RESULTS) -> None:
    results.mkdir(parents=True, exist_ok=True)
    path = results / "startup.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    doc[label] = record
    path.write_text(json.dumps(doc, indent=2) + "\n")
    labels = list(doc)
    names = list(next(iter(doc.values()))["commands"])
    lines = ["# Start-up: wall time of a new user's first commands",
             "",
             "Median of fresh processes (`benchmarks/startup.py`); the load average at start and "
             "end of each run is in startup.json: compare columns measured on a quiet machine.",
             "",
             "| command | " + " | ".join(f"{lb} ({doc[lb]['commit'] or '?'})" for lb in labels)
             + " |",
             "|---|" + "---:|" * len(labels)]
    for n in names:
        cells = [f"{doc[lb]['commands'][n]['median_s']:.2f} s" if n in doc[lb]["commands"]
                 else "" for lb in labels]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "| run | machine | OMP_NUM_THREADS | repeats | $RAPT_CACHE "
              "| load at start → end |",
              "|---|---|---|---|---|---|"]
    for lb in labels:
        r = doc[lb]
        la = f"{r['loadavg_start'][0]:.2f} → {r['loadavg_end'][0]:.2f}"
        lines.append(f"| {lb} | {r['machine']['cpu']}, {r['machine']['cpu_count']} cores | "
                     f"{r['machine']['omp_num_threads'] or 'unset'} | {r['repeats']} | "
                     f"{r.get('cache', '?')} | {la} |")
    (results / "startup.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=ROOT, help="source tree whose src/ is run")
    ap.add_argument("--label", default=None, help="name of this run (default: its commit)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="interpreter with rapt's deps")
    ap.add_argument("--backbone", default="minilm")
    ap.add_argument("--data", type=Path, default=DATA, help="a GLUE SST-2 TSV file")
    ap.add_argument("--threads", default=None, help="set OMP_NUM_THREADS (default: unset)")
    ap.add_argument("--warm-cache", action="store_true",
                    help="share one $RAPT_CACHE across runs (default: each run starts empty)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of startup.json/.md")
    a = ap.parse_args()
    src = a.src.resolve()
    if not (src / "src" / "rapt" / "cli").is_dir():
        raise SystemExit(f"--src {src}: no src/rapt/cli there (give a rapt source tree)")
    start = list(os.getloadavg())
    commands = measure(src, a.python, a.repeats, a.backbone, a.data, a.threads, a.warm_cache)
    record = {"src": str(src), "commit": _commit(src), "repeats": a.repeats,
              "cache": "warm" if a.warm_cache else "empty per run",
              "machine": _machine(a.threads), "loadavg_start": start,
              "loadavg_end": list(os.getloadavg()), "commands": commands}
    label = a.label or record["commit"] or "run"
    write(label, record, a.results)
    print(json.dumps({label: {k: v["median_s"] for k, v in commands.items()}}))


if __name__ == "__main__":
    main()
