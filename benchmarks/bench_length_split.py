"""Tuning time with and without the length split of :class:`rapt.training.loop.MeanStep`: the
demo's prefix runs (600 SST-2 rows, 150 steps, first seed), each setting tuned twice on the
same rows and batches, once in one padded pass per batch and once in passes by length; the
tuned probabilities on the demo's test rows must agree.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_length_split   # ~8 min on one AVX2 core
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

import rapt.training.loop as loop
from benchmarks._common import command, machine, write_json, write_md

OUT = Path(__file__).parent / "results"


def _timed(run, rows, labels, test_rows, split: bool) -> tuple[float, object]:
    """(seconds of one tune, test probabilities) with the length split on or off."""
    orig = loop.MeanStep.__init__

    def init(self, *a, lengths=None, **k):
        orig(self, *a, lengths=lengths if split else None, **k)

    loop.MeanStep.__init__ = init
    try:
        t = time.perf_counter()
        run.tune(rows, labels, 2)
        return time.perf_counter() - t, run.predict_proba(test_rows)
    finally:
        loop.MeanStep.__init__ = orig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from rapt.demo import DemoConfig, _demo_data, _text_length, _tune_config
    from rapt.models import load_backbone
    from rapt.pipeline import Customization, Encoding

    bb, cfg, quiet = load_backbone("minilm"), DemoConfig(), (lambda s: None)
    train, test = _demo_data(cfg, quiet)
    base = _tune_config(cfg, bb, list(train.label_names))
    n_text, _ = _text_length(cfg, bb.tokenizer, train.texts, quiet)
    custom = Customization.create(bb, eta=1.0)  # clean rows: the split does not look at noise
    m = cfg.plain_len
    with_k = replace(custom, encoding=Encoding.sampled(bb.tokenizer, n_text + m, m, 1,
                                                       len(train), cfg.seed))
    cells = []
    for name, c, rec in (("text rows (no privacy, +privatization)", custom, False),
                         ("rows with k (+reconstruction)", with_k, True)):
        run = replace(c, config=replace(base, seed=cfg.seed, reconstruction=rec,
                                        max_length=n_text + (m if rec else 0)))
        rows, test_rows = c.rows(train.texts), c.rows(test.texts, queries=True)
        one, two, diff = [], [], 0.0
        for _ in range(args.repeats):  # interleaved: a change of load hits both alike
            s1, p1 = _timed(run, rows, train.labels, test_rows, split=False)
            s2, p2 = _timed(run, rows, train.labels, test_rows, split=True)
            one, two = one + [round(s1, 1)], two + [round(s2, 1)]
            diff = max(diff, float((p1 - p2).abs().max()))
        cells.append({"rows": name, "one_pass_s": one, "by_length_s": two,
                      "max_abs_proba_diff": diff})
    from rapt.precision import cpu_has_native_bf16

    doc = {"command": command(), "steps": 150, "cells": cells,
           "machine": {**machine(native_bf16=cpu_has_native_bf16()),
                       "loadavg_end": list(os.getloadavg())}}
    write_json(args.out / "length_split.json", doc)
    write_md(args.out / "length_split.md", [
        "# Tuning in passes by length", "", f"`{doc['command']}`", "",
        "Seconds per 150-step tuning run, each repeat in turn (one padded pass, then passes by "
        "length); probabilities compared on the demo's test rows.", "",
        "| rows | one padded pass (s) | passes by length (s) | max abs. probability diff. |",
        "|---|---|---|---|",
        *(f"| {c['rows']} | {', '.join(map(str, c['one_pass_s']))} | "
          f"{', '.join(map(str, c['by_length_s']))} | "
          f"{c['max_abs_proba_diff']:.1e} |" for c in cells)])


if __name__ == "__main__":
    main()
