"""Wall-clock time of the two entry points a new user runs (issue 31 items 2, 3, 5).

``--what test`` times the test suite as ``make test`` runs it (``OMP_NUM_THREADS=2 python -m
pytest -q`` plus ``--pytest-args``); ``--what fresh-test`` times ``make test`` in a fresh clone
of HEAD, install included (issue 31 item 2's measure); ``--what demo`` times ``rapt demo``
(plus ``--demo-args``) and keeps the time of each stage and the verdict that it printed. Each
run is appended to ``benchmarks/results/wallclock.json`` under its name, with the machine and
the load average at start and end; ``benchmarks/speed_table.py`` reads the latest of each.

    python -m benchmarks.bench_wallclock --what test
    python -m benchmarks.bench_wallclock --what fresh-test
    python -m benchmarks.bench_wallclock --what demo --demo-args "--precision bf16"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import RESULTS, command, machine, write_json

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "wallclock.json"


def run(argv: list[str], env: dict) -> tuple[float, str, int]:
    """(seconds, combined output, exit code) of ``argv``."""
    t = time.perf_counter()
    p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    return time.perf_counter() - t, p.stdout + p.stderr, p.returncode


def _pytest_record(argv: list[str], seconds: float, out: str, code: int) -> dict:
    summary = next((ln for ln in reversed(out.splitlines()) if " in " in ln and
                    ("passed" in ln or "failed" in ln)), "")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|"
                                                r"deselected|xfailed|xpassed)", summary)}
    durations = [ln for ln in out.splitlines() if re.match(r"^\d+\.\d+s (call|setup|teardown)",
                                                           ln)]
    return {"argv": argv, "seconds": round(seconds, 1), "exit_code": code, "summary": summary,
            "counts": counts, "durations": durations[:60]}


def time_tests(args, env: dict) -> dict:
    argv = [sys.executable, "-m", "pytest", "-q", *shlex.split(args.pytest_args)]
    return _pytest_record(argv, *run(argv, env))


def time_fresh_clone(args, env: dict) -> dict:
    """``make test`` in a fresh clone of HEAD (install included), as CI runs it: the clone
    sits beside a link to this checkout's ``../shared``. pip's cache stays warm, so
    downloads are not counted."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "rapt"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        if (ROOT.parent / "shared").exists():
            (Path(tmp) / "shared").symlink_to(ROOT.parent / "shared")
        env = {k: v for k, v in env.items() if k not in ("VIRTUAL_ENV", "OMP_NUM_THREADS")}
        t = time.perf_counter()
        p = subprocess.run(["make", "test"], cwd=repo, env=env, capture_output=True, text=True)
        rec = _pytest_record(["make", "test"], time.perf_counter() - t, p.stdout + p.stderr,
                             p.returncode)
        rec["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, text=True,
                                       capture_output=True).stdout.strip()
    return rec


def time_demo(args, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(Path(sys.executable).with_name("rapt")), "demo", "--out", tmp,
                *shlex.split(args.demo_args)]
        seconds, out, code = run(argv, env)
        res = json.loads((Path(tmp) / "results.json").read_text()) if code == 0 else {}
        rec = {"argv": argv, "seconds": round(seconds, 1), "exit_code": code,
               "stage_seconds": {k: round(v, 1) for k, v in res.get("stage_seconds", {}).items()},
               "verdict": res.get("verdict", res.get("verdicts")),
               "accuracy": {r["setting"]: r["accuracy"] for r in res.get("rows", [])},
               "paired": res.get("paired"), "tail": out.splitlines()[-12:] if code else []}
        if args.demo_keep and code == 0:
            from rapt.precision import cpu_has_native_bf16
  # the run's own files, as results/STEM.{json,md,png}
            stem = RESULTS / args.demo_keep
            write_json(stem.with_suffix(".json"), {
                "command": command(), "machine": machine(native_bf16=cpu_has_native_bf16(),
                                                   threads=int(args.threads)),
                "seconds": rec["seconds"], "result": res})
            shutil.copy(Path(tmp) / "results.md", stem.with_suffix(".md"))
            shutil.copy(Path(tmp) / "demo.png", stem.with_suffix(".png"))
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--what", choices=["test", "fresh-test", "demo"], required=True)
    ap.add_argument("--name", help="key in wallclock.json (default: --what)")
    ap.add_argument("--threads", default="2", help="OMP_NUM_THREADS of the timed command")
    ap.add_argument("--pytest-args", default="")
    ap.add_argument("--demo-args", default="")
    ap.add_argument("--demo-keep", metavar="STEM",
                    help="keep the timed demo's files as benchmarks/results/STEM.{json,md,png}")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    from rapt.precision import cpu_has_native_bf16

    env = {**os.environ, "OMP_NUM_THREADS": args.threads}
    rec = {"command": command(),
           "machine": machine(native_bf16=cpu_has_native_bf16(), omp_num_threads=args.threads,
                              threads=int(args.threads)),
           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    timer = {"test": time_tests, "fresh-test": time_fresh_clone, "demo": time_demo}[args.what]
    rec.update(timer(args, env))
    rec["machine"]["loadavg_end"] = list(os.getloadavg())
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc.setdefault(args.name or args.what, []).append(rec)
    args.out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in rec.items() if k != "durations"}, indent=2,
                     ensure_ascii=False))


if __name__ == "__main__":
    main()
