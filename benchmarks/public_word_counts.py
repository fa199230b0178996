"""Write rapt's public word list (``src/rapt/resources/public_word_counts.txt``): the words of
public text disjoint from the evaluation tasks, with their counts, from which
:mod:`rapt.privacy.kinds` takes each token's frequency band.

Counted on every split of TREC, CB (premises and hypotheses) and TrustPilot, and rapt's bundled
public sample (:func:`rapt.privacy.kinds.public_word_texts`); never on SST-2 or Financial
PhraseBank, whose privacy is measured by kind. Words counted once are left out (they, like
every word the list lacks, are in the rarest band), which keeps the file small.

    python -m benchmarks.public_word_counts
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks._common import ROOT, command
from rapt.privacy.kinds import (
    BAND_EDGES,
    count_words,
    load_word_frequencies,
    public_word_texts,
    write_word_frequencies,
)

OUT = ROOT / "src" / "rapt" / "resources" / "public_word_counts.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-count", type=int, default=2)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    texts, sources = public_word_texts()
    counts = count_words(texts)
    kept = sum(c >= args.min_count for c in counts.values())
    header = [
        "Public word list of rapt.privacy.kinds: normalized word (lower case, no accents; a run "
        "of letters and digits, or one punctuation character), TAB, count.",
        "Counted on: " + ", ".join(f"{s['name']}/{s['split']} ({s['texts']:,} texts)"
                                   for s in sources) + "; never SST-2 or Financial PhraseBank.",
        f"{len(texts):,} texts, {sum(counts.values()):,} words, {len(counts):,} distinct; "
        f"the {kept:,} counted at least min_count times are listed.",
        f"Bands: the {', '.join(f'{k:,}' for k in BAND_EDGES)} most frequent words; ties at "
        "an edge go to the rarer band.",
        f"Written by `{command()}`.",
    ]
    path = write_word_frequencies(Path(args.out), counts, min_count=args.min_count,
                                  header=header)
    print(f"{path}: {kept:,} words; band sizes "
          f"{load_word_frequencies(path).band_sizes()}")


if __name__ == "__main__":
    main()
