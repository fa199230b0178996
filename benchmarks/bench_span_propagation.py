"""How many more tokens are personal data once a name found in one text is marked in every text
(:func:`rapt.privacy.by_kind.personal_spans`): per task and split of the by-kind grid, the share
of tokens Presidio marks in each text alone, the share after carrying every found
PERSON / LOCATION / ORGANIZATION over the whole split, and the strings carried most often.

Under ``--personal-p 1`` every personal token is released independently of itself, so the added
share is task signal the mechanism no longer lets through: this says how much the grid's
accuracy cells (measured before propagation) could move, without re-running them.

    python -m benchmarks.bench_span_propagation --spans .gpu-carry/personal_spans.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from collections import Counter
from pathlib import Path

from benchmarks._common import RESULTS, command, machine, write_json, write_md

SPLITS = (("sst2-sentences", "train"), ("sst2-sentences", "dev"),
          ("financial_phrasebank", "train"), ("financial_phrasebank", "dev"),
          ("trec", "train"), ("trec", "test"))


def one_split(texts: list[str], lookup: dict, tokenizer) -> dict:
    from rapt.privacy.by_kind import personal_spans
    from rapt.privacy.kinds import token_kinds

    found = [list(lookup[t]) for t in texts]
    widened = personal_spans(texts, spans=lookup)
    before = token_kinds(texts, tokenizer, spans=found)
    after = token_kinds(texts, tokenizer, spans=widened)
    tokens = sum(len(r) for r in before.ids)
    n_before = sum(map(sum, before.personal))
    n_after = sum(map(sum, after.personal))
    carried = Counter(t[s.start:s.end] for t, spans in zip(texts, widened, strict=True)
                      for s in spans if s.recognizer == "propagated")
    return {"texts": len(texts), "tokens": tokens, "personal_found": n_before,
            "personal_after": n_after,
            "texts_changed": sum(a != b for a, b in zip(before.personal, after.personal,
                                                        strict=True)),
            "carried_spans": sum(carried.values()), "top_carried": carried.most_common(12)}


def markdown(doc: dict) -> str:
    lines = ["# A name found once, marked everywhere: personal tokens before and after", "",
             f"`{doc['command']}` ({doc['wall_s']:.0f} s, {doc['machine']['platform']}).", "",
             "Presidio's spans per text (the lookup of `benchmarks.personal_spans`, "
             f"{doc['detector']}); then every {'/'.join(doc['propagated'])} string found in a "
             "text of the split marked wherever it recurs in the split, whole words in the case "
             "found (one word among the 1,000 most frequent public words excepted). Tokens: "
             "MiniLM's word pieces, specials excluded.", "",
             "| task | split | texts | tokens | personal, found per text | after carrying | "
             "added | texts changed | carried most often |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        t = r["tokens"]
        top = ", ".join(f"{s} ×{n}" for s, n in r["top_carried"][:6]) or "—"
        lines.append(f"| {r['task']} | {r['split']} | {r['texts']:,} | {t:,} | "
                     f"{100 * r['personal_found'] / t:.2f} % | {100 * r['personal_after'] / t:.2f}"
                     f" % | +{100 * (r['personal_after'] - r['personal_found']) / t:.2f} pt | "
                     f"{r['texts_changed']:,} | {top} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from benchmarks.personal_spans import load_spans
    from rapt.data import load_dataset
    from rapt.models import load_backbone
    from rapt.privacy.personal_data import PROPAGATED

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", required=True, help="benchmarks.personal_spans lookup")
    ap.add_argument("--backbone", default="minilm")
    ap.add_argument("--out", default=str(RESULTS / "span_propagation"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    lookup = load_spans(args.spans)
    tok = load_backbone(args.backbone).tokenizer
    rows = []
    for name, split in SPLITS:
        texts = [t for t in load_dataset(name, split).texts if t]
        rows.append({"task": name, "split": split, **one_split(texts, lookup, tok)})
        print(rows[-1]["task"], split, rows[-1]["personal_found"], rows[-1]["personal_after"],
              flush=True)
    with gzip.open(args.spans, "rt", encoding="utf-8") as f:
        det = json.load(f)["detector"]
    doc = {"command": command(), "machine": machine(), "wall_s": time.perf_counter() - t0,
           "detector": f"Presidio with {det['ner_model'] or 'no NER model'}, score ≥ "
                       f"{det['score_threshold']}",
           "propagated": list(PROPAGATED), "rows": rows}
    write_json(Path(f"{args.out}.json"), doc, ensure_ascii=False)
    write_md(Path(f"{args.out}.md"), markdown(doc))


if __name__ == "__main__":
    main()
