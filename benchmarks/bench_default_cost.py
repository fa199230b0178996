"""What rapt's default policy (noise by kind of token) costs in time over uniform noise.

The default classifies every token before the noise: Presidio (spaCy's small English model and
pattern recognizers) finds personal data, rapt's public word list marks rare words. Measured on
the first N SST-2 training sentences with MiniLM, in one process, each stage timed apart:

* Presidio's model load (once per process);
* finding personal data in the N texts (a fresh detector, so nothing is memoized);
* privatizing the N rows, uniform (η for P 0.6) and by kind (η for P 0.7, the default
  policy, the findings given; names carried to their other copies), best of ``--repeats``
  timings each.

Writes benchmarks/results/default_cost.{json,md,png}.

    python -m benchmarks.bench_default_cost --rows 2000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks._common import RESULTS, command, machine, save_png, write_json, write_md


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def run(rows: int, repeats: int, seed: int) -> dict:
    from rapt.data import load_dataset
    from rapt.models import load_backbone
    from rapt.pipeline import Customization
    from rapt.privacy.by_kind import default_policy
    from rapt.privacy.personal_data import PersonalDataDetector
    from rapt.privacy.rule import DEFAULT_PROTECTED_P, DEFAULT_TARGET_P

    bb = load_backbone("minilm")
    texts = list(load_dataset("sst2", split="train").texts[:rows])
    t0 = time.perf_counter()
    detector = PersonalDataDetector()
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    spans = dict(zip(texts, detector.find_all(texts), strict=True))  # text -> its findings
    find_s = time.perf_counter() - t0
    uniform = Customization.create(bb, target_p=DEFAULT_TARGET_P, noise_seed=seed)
    by_kind = Customization.create(bb, target_p=DEFAULT_PROTECTED_P, noise_seed=seed,
                                   kind_policy=default_policy(), personal_spans=spans)
    ids = uniform.rows(texts)
    n_tokens = sum(len(r) for r in ids)
    out = {"rows": len(texts), "tokens": n_tokens, "presidio_load_s": load_s,
           "personal_data_s": find_s,
           "privatize_uniform_s": _best(lambda: uniform.privatize(ids, measure=False), repeats),
           "privatize_by_kind_s": _best(
               lambda: by_kind.privatize(ids, measure=False, texts=texts), repeats)}
    out["default_total_s"] = out["personal_data_s"] + out["privatize_by_kind_s"]
    out["ms_per_row_personal_data"] = 1000 * find_s / len(texts)
    return out


def markdown(doc: dict) -> str:
    r = doc["result"]
    rows = [("Presidio's model load (once per process)", r["presidio_load_s"]),
            ("personal data found in the texts", r["personal_data_s"]),
            ("privatize, uniform (P 0.6)", r["privatize_uniform_s"]),
            ("privatize, by kind (P 0.7, spans given)", r["privatize_by_kind_s"]),
            ("the default end to end (spans + privatize)", r["default_total_s"])]
    return "\n".join([
        "# What the default policy costs in time", "", f"`{doc['command']}`", "",
        f"{r['rows']:,} SST-2 training sentences ({r['tokens']:,} tokens with specials), "
        f"MiniLM, {doc['machine'].get('cpu_count')} CPUs; privatization timings the best of "
        f"{doc['repeats']}. Personal data: {r['ms_per_row_personal_data']:.1f} ms per sentence.",
        "", "| stage | seconds |", "|---|---|",
        *[f"| {name} | {s:.1f} |" for name, s in rows], ""])


def plot(doc: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = doc["result"]
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.barh(["uniform (--protect all)"], [r["privatize_uniform_s"]], color="tab:blue")
    ax.barh(["by kind (the default)"], [r["personal_data_s"]], color="tab:orange",
            label="personal data (Presidio)")
    ax.barh(["by kind (the default)"], [r["privatize_by_kind_s"]], left=[r["personal_data_s"]],
            color="tab:blue", label="privatization")
    ax.set_xlabel(f"seconds for {r['rows']:,} SST-2 sentences")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    save_png(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "default_cost"))
    args = ap.parse_args()
    doc = {"command": command(), "machine": machine(), "repeats": args.repeats,
           "result": run(args.rows, args.repeats, args.seed)}
    out = Path(args.out)
    write_json(out.with_suffix(".json"), doc)
    write_md(out.with_suffix(".md"), markdown(doc))
    plot(doc, out.with_suffix(".png"))
    print(markdown(doc))


if __name__ == "__main__":
    main()
