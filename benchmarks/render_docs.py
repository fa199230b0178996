"""Render every results table of README.md and docs/**/*.md from benchmarks/results/*.json.

A rendered block sits between ``<!-- rendered: NAME -->`` and ``<!-- /rendered -->``; NAME is a
key of ``BLOCKS``, whose function builds the block from the JSON with the benchmark's own table
writer (the same lines its ``.md`` carries). A results table outside such a block is refused
(tests/test_docs_rendered.py), except the non-result tables named in ``NOT_RESULTS``.

    python -m benchmarks.render_docs            # rewrite every block in place
    python -m benchmarks.render_docs --check    # exit 1, naming each block that differs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks._common import RESULTS

ROOT = RESULTS.parents[1]
BLOCK = re.compile(r"<!-- rendered: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /rendered -->",
                   re.S)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
TABLE = re.compile(r"^(\|.*\|)\n\|[-|: ]+\|\n((?:\|.*\|\n?)*)", re.M)
NUMBER = re.compile(r"\d")

# Tables in README/docs that hold no measured number (module maps, routes, options): their
# header rows, exactly. Anything else with a digit in its body is a results table.
NOT_RESULTS = frozenset({
    "| module | concept |",
    "| new … | goes in | and is registered by |",
    "| family | what each row carries into the shared, frozen pass |",
    "| step k | direction | message | content |",
    "| route | body in | body out | rule |",
    "| route | what it does |",
    "| concern | single machine (default) | scaled out (built, tested) |",
    "| command | what it does |",
})


def _json(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _source(name: str, doc: dict, lead: str = "From") -> str:
    cmd = doc.get("command") or doc.get("settings", {}).get("command")
    said = f", written by `{cmd}`" if cmd else ""
    return f"{lead} [`benchmarks/results/{name}.json`]({{results}}/{name}.md){said}.\n\n"


def headline_goal() -> str:
    from benchmarks.local_baseline_report import goal
    doc = _json("local_baseline")
    return _source("local_baseline", doc) + "\n".join(goal(doc["summary"])) + "\n"


def headline_wins() -> str:
    from benchmarks.local_baseline_report import wins
    doc = _json("local_baseline")
    return _source("local_baseline", doc) + "\n".join(wins(doc["summary"])) + "\n"


def local_baseline_2000() -> str:
    from benchmarks.local_baseline_report import table
    doc = _json("local_baseline")
    rows = [r for r in doc["summary"]
            if r["rows"] == ("all" if r["task"] == "fp" else "2000")]
    return _source("local_baseline", doc) + "\n".join(table(rows)) + "\n"


def defaults() -> str:
    from benchmarks.bench_defaults import cell_table, overall_table
    doc = _json("defaults")
    return (_source("defaults", {"command": "python -m benchmarks.bench_defaults"})
            + "\n".join(cell_table(doc)) + "\n\n" + "\n".join(overall_table(doc)) + "\n")


def by_kind_accuracy() -> str:
    from benchmarks.local_baseline_by_kind import table
    doc = _json("local_baseline_by_kind")
    rows = [r for r in doc["summary"] if r["rows"] == "2000"]
    return _source("local_baseline_by_kind", doc) + "\n".join(table(rows)) + "\n"


def _privacy_files() -> tuple[list[str], dict | None]:
    """The privacy files present, in the order of
    :data:`benchmarks.local_baseline_by_kind.PRIVACY_FILES`, and their merged cells (each
    (setting, task) from the first file that has it)."""
    from benchmarks.local_baseline_by_kind import PRIVACY_FILES, merged_privacy
    files = [n for n in PRIVACY_FILES if (RESULTS / f"{n}.json").exists()]
    return files, merged_privacy([RESULTS / f"{n}.json" for n in files])


def default_choice() -> str:
    """The README's side-by-side table: the former default and rapt's default, accuracy and
    privacy per kind."""
    from benchmarks.local_baseline_by_kind import default_table
    doc = _json("local_baseline_by_kind")
    return (_source("local_baseline_by_kind", doc)
            + "\n".join(default_table(doc["summary"], _privacy_files()[1])) + "\n")


def by_kind_privacy() -> str:
    """Privacy per kind at every setting measured (:func:`_privacy_files`)."""
    from benchmarks.local_baseline_by_kind import privacy_table
    files, doc = _privacy_files()
    extra = "".join(_source(n, _json(n), lead="Cells the files above lack from")
                    for n in files[1:])
    return _source(files[0], doc) + extra + "\n".join(privacy_table(doc)) + "\n"


def demo() -> str:
    """What `rapt demo` printed in the run bench_wallclock kept (its table, from the JSON)."""
    from rapt.demo_choice import ChoiceResult, format_table, verdict_lines

    doc = _json("demo")
    res = ChoiceResult(**doc["result"])
    return (_source("demo", doc) + f"{doc['seconds']:.0f} s on {_machine(doc)}:\n\n"
            + format_table(res) + "\n\nThe verdicts (the last seed's test rows):\n\n"
            + "\n\n".join(f"> {line}" for line in verdict_lines(res)) + "\n")


def _machine(doc: dict) -> str:
    m = doc.get("machine") or doc.get("user_side_machine") or doc.get("settings", {}).get(
        "machine") or {}
    if not isinstance(m, dict) or not m:
        return "not recorded"
    parts = [str(m[k]) for k in ("device", "platform") if m.get(k)]
    if m.get("cpu_count"):
        parts.append(f"{m['cpu_count']} CPUs")
    return ", ".join(parts) or "not recorded"


def benchmark_index() -> str:
    """Every result set: its page, the command that wrote it and the machine it ran on."""
    lines = ["| result | command | machine |", "|---|---|---|"]
    for path in sorted(RESULTS.glob("*.json")):
        doc = json.loads(path.read_text())
        doc = doc if isinstance(doc, dict) else {}
        md = path.with_suffix(".md")
        name = f"[{path.stem}]({{results}}/{md.name})" if md.exists() else path.stem
        cmd = doc.get("command") or (doc.get("remote") or {}).get("command") or "not recorded"
        cmd = str(cmd).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {name} | `{cmd}` | {_machine(doc).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


BLOCKS: dict[str, Callable[[], str]] = {
    "headline-goal": headline_goal, "headline-wins": headline_wins,
    "local-baseline-2000": local_baseline_2000, "defaults": defaults,
    "by-kind-accuracy": by_kind_accuracy, "by-kind-privacy": by_kind_privacy,
    "benchmark-index": benchmark_index, "demo": demo, "default-choice": default_choice,
}


class UnknownBlock(ValueError):
    pass


def results_link(path: Path) -> str:
    """How a page at ``path`` links to benchmarks/results: the repository folder from the README,
    the site's copy (benchmarks/docs_hook.py) from docs/."""
    rel = path.resolve().relative_to(ROOT)
    if rel.parts[0] != "docs":
        return "benchmarks/results"
    return "/".join([".."] * (len(rel.parts) - 2) + ["benchmarks", "results"])


def render_text(text: str, path: Path, cache: dict[str, str] | None = None) -> str:
    """``text`` with every block rebuilt from the JSON; UnknownBlock names a marker's bad NAME."""
    cache = {} if cache is None else cache

    def one(m: re.Match) -> str:
        name = m["name"]
        if name not in BLOCKS:
            raise UnknownBlock(f"{path}: <!-- rendered: {name} --> names no block; known: "
                               f"{', '.join(sorted(BLOCKS))} (benchmarks/render_docs.py)")
        if name not in cache:
            cache[name] = BLOCKS[name]()
        body = cache[name].replace("{results}", results_link(path))
        return f"<!-- rendered: {name} -->\n{body}<!-- /rendered -->"

    return BLOCK.sub(one, text)


def unrendered_tables(text: str) -> list[str]:
    """Header rows of the results tables outside rendered blocks and code fences."""
    bare = FENCE.sub("", BLOCK.sub("", text))
    return [m[1] for m in TABLE.finditer(bare)
            if m[1].strip() not in NOT_RESULTS and NUMBER.search(m[2])]


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 on a difference")
    args = ap.parse_args()
    cache: dict[str, str] = {}
    differ = []
    for path in doc_files():
        text = path.read_text()
        new = render_text(text, path, cache)
        if new != text:
            differ.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new)
    if args.check and differ:
        sys.exit("rendered blocks differ from benchmarks/results/*.json in: " + ", ".join(differ)
                 + " (python -m benchmarks.render_docs rewrites them)")
    print(("differ: " if args.check else "rewritten: ") + (", ".join(differ) or "none"))


if __name__ == "__main__":
    main()
