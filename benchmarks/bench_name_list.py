"""What the Census name lists add to spaCy's names (:mod:`rapt.privacy.name_list`): recall when
text is lower-cased, and the words they mark that spaCy does not.

Reference: the words inside spaCy's PERSON spans on the *cased* text (spaCy's small model,
Presidio's recognizer, score ≥ its threshold): itself a noisy reference, with misses and
mistakes of its own, but drawn independently of the name lists and of the canaries' names.
Each text is then lower-cased and its names sought again by spaCy alone, the lists alone and
both: the share of reference words each finds. On every task, the share of words the lists mark
PERSON in the text as it is where spaCy marks none, and the words marked most often (hits and
false alarms, for the reader to judge).

    python -m benchmarks.bench_name_list --rows 2000 --seed 0
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from pathlib import Path

from benchmarks._common import RESULTS, command, machine, save_png, write_json, write_md

TASKS = (("trustpilot", "a"), ("trec", "train"), ("cb", "train"),
         ("financial_phrasebank", "train"), ("sst2-sentences", "train"))
LOWER_CASE_TASKS = ("sst2-sentences",)  # already lower-cased: no cased reference


def _words_in(spans: list[tuple[int, int]], words: list[tuple[int, int, str]]) -> set[int]:
    return {i for i, (a, b, _) in enumerate(words) if any(s < b and a < e for s, e in spans)}


def _person(detector, text: str) -> list[tuple[int, int]]:
    return [(s.start, s.end) for s in detector.find(text) if s.entity == "PERSON"]


def one_task(texts: list[str], cased: bool, spacy, lists) -> dict:
    """``spacy``: a detector without the name lists; ``lists``: one with them (its
    :meth:`names_by_list` are the lists' own findings)."""
    from rapt.privacy.public_words import word_spans

    ref = found_spacy = found_list = found_either = words_total = beyond = 0
    marked: Counter[str] = Counter()
    for text in texts:
        words = word_spans(text)
        words_total += len(words)
        listed = _words_in([(s, e) for s, e, _ in lists.names_by_list(text)], words)
        extra = listed - _words_in(_person(spacy, text), words)
        beyond += len(extra)
        marked.update(words[i][2] for i in extra)
        low = text.lower()
        if not cased or len(low) != len(text):  # offsets must carry over to the lower case
            continue
        truth = _words_in(_person(spacy, text), words)
        if not truth:
            continue
        by_spacy = _words_in(_person(spacy, low), words) & truth
        by_list = _words_in([(s, e) for s, e, _ in lists.names_by_list(low)], words) & truth
        ref += len(truth)
        found_spacy += len(by_spacy)
        found_list += len(by_list)
        found_either += len(by_spacy | by_list)
    return {"texts": len(texts), "words": words_total, "reference_words": ref,
            "lower_spacy": found_spacy, "lower_list": found_list, "lower_either": found_either,
            "beyond_spacy": beyond, "top_beyond": marked.most_common(20)}


def _pct(k: int, n: int) -> str:
    return f"{100 * k / n:.1f} %" if n else "—"


def markdown(doc: dict) -> str:
    lines = ["# Names by list: what the Census name lists add to spaCy's", "",
             f"`{doc['command']}` ({doc['wall_s']:.0f} s, {doc['machine']['platform']}).", "",
             f"spaCy: {doc['spacy']}. Lists: {doc['name_list']['source']}; "
             f"{doc['name_list']['first_names']:,} given names (borne by ≥ "
             f"{doc['name_list']['min_first_share_percent']} % of people), "
             f"{doc['name_list']['surnames']:,} surnames; rules in `rapt.privacy.name_list`. "
             f"Up to {doc['row_limit']:,} texts per task (seed {doc['seed']}).", "",
             "**Reference**: the words of spaCy's PERSON spans in the cased text (noisy, but "
             "drawn independently of the lists). **On lower-cased text**: the share of those "
             "words found again by spaCy alone, the lists alone, either. **Beyond spaCy**: words "
             "the lists mark in the text as it is where spaCy marks no PERSON, as a share of "
             "all words, with the words marked most often (real names spaCy missed and false "
             "alarms alike). The canary benchmark's names come from the lists' most common "
             "entries, so its result with the lists is a check of the rules, not of recall: "
             "this table is the recall.", "",
             "| task | texts | words | reference words | lower case: spaCy | lists | either | "
             "beyond spaCy | marked most often beyond spaCy |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["results"]:
        n = r["reference_words"]
        top = ", ".join(f"{w} ×{k}" for w, k in r["top_beyond"][:10]) or "—"
        lines.append(f"| {r['task']} | {r['texts']:,} | {r['words']:,} | {n:,} | "
                     f"{_pct(r['lower_spacy'], n)} | {_pct(r['lower_list'], n)} | "
                     f"{_pct(r['lower_either'], n)} | {_pct(r['beyond_spacy'], r['words'])} | "
                     f"{top} |")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["results"] if r["reference_words"]]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.27
    for j, (key, label) in enumerate((("lower_spacy", "spaCy alone"), ("lower_list", "lists"),
                                      ("lower_either", "either"))):
        ax.bar([i + (j - 1) * width for i in range(len(rows))],
               [100 * r[key] / r["reference_words"] for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), [r["task"] for r in rows])
    ax.set_ylabel("spaCy's cased PERSON words found, %")
    ax.set_title("Names in lower-cased text", fontsize=10)
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)


def main() -> None:
    from rapt.data import load_dataset
    from rapt.privacy.personal_data import PersonalDataDetector
    from rapt.progress import progress_bar

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2000, help="texts per task, sampled")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "name_list"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    spacy = PersonalDataDetector(name_list=False)
    if spacy.ner_model is None:
        raise SystemExit(spacy.ner_missing)
    lists = PersonalDataDetector()  # with the lists, and the WordNet words of the same model
    rows = []
    for name, split in progress_bar(TASKS, desc="tasks", unit="task"):
        texts = [t for t in load_dataset(name, split).texts if t]
        if len(texts) > args.rows:
            texts = random.Random(args.seed).sample(texts, args.rows)
        rows.append({"task": name, "split": split,
                     **one_task(texts, name not in LOWER_CASE_TASKS, spacy, lists)})
    doc = {"command": command(), "machine": machine(), "wall_s": time.perf_counter() - t0,
           "row_limit": args.rows, "seed": args.seed,
           "spacy": f"{spacy.ner_model}, score ≥ {spacy.score_threshold}",
           "name_list": lists.name_list, "results": rows}
    write_json(Path(f"{args.out}.json"), doc, ensure_ascii=False)
    write_md(Path(f"{args.out}.md"), markdown(doc))
    plot(doc, Path(f"{args.out}.png"))


if __name__ == "__main__":
    main()
