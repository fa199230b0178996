"""Personal-data spans of every text of rapt's built-in datasets, found once, here, by Presidio:
a lookup (text -> spans) for a machine that lacks Presidio and spaCy (the lent GPU), given to
:class:`rapt.pipeline.Customization` as ``personal_spans``.

    python -m benchmarks.personal_spans --out .gpu-carry/personal_spans.json.gz

The file holds the built-in datasets' texts (public benchmark data, never a user's) and, per
text, its spans as [start, end, entity, score, recognizer]; the detector's record is in its
header.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from rapt.channel.corpus import _FAMILY_SPLITS
from rapt.data import load_dataset
from rapt.privacy.personal_data import PersonalDataDetector, PersonalSpan
from rapt.progress import progress_bar


def all_texts() -> list[str]:
    seen: dict[str, None] = {}
    for splits in _FAMILY_SPLITS.values():
        for name, split in splits:
            ds = load_dataset(name, split)
            for t in [*ds.texts, *ds.text_pairs]:
                if t:
                    seen.setdefault(t, None)
    return list(seen)


def load_spans(path: str | Path) -> dict[str, list[PersonalSpan]]:
    """The lookup a :func:`main` run wrote."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return {t: [PersonalSpan(*s) for s in spans] for t, spans in data["spans"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    texts = all_texts()
    det = PersonalDataDetector()
    out: dict[str, list] = {}
    with progress_bar(total=len(texts), desc="personal-data spans", unit="text") as b:
        for s in range(0, len(texts), 200):
            chunk = texts[s:s + 200]
            for t, found in zip(chunk, det.find_all(chunk), strict=True):
                out[t] = [[x.start, x.end, x.entity, x.score, x.recognizer] for x in found]
            b.update(len(chunk))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt", encoding="utf-8") as f:
        json.dump({"detector": det.record, "spans": out}, f)
    print(f"{len(out):,} texts, {sum(bool(v) for v in out.values()):,} with spans -> {args.out}")


if __name__ == "__main__":
    main()
