"""Channel data: public text privatized by the provider, at any η it chooses.

The provider can learn the privatization channel p(original | privatized, context) from text
that is public and disjoint from the customer's task: privatizing it costs no privacy, and any
model trained on the pairs is post-processing of the mechanism's output wherever it is applied.

* :class:`ChannelCorpus`: public texts + provenance (which datasets and splits, how many rows,
  how many tokens under which tokenizer, which evaluation task it is disjoint from);
  :func:`public_corpus_for` builds one from rapt's built-in datasets and refuses to include
  the evaluation task's own text.  A real deployment would use a general web or encyclopedic
  corpus instead (docs/THREAT_MODEL.md, "Contextual reconstruction (the channel)").
* :func:`privatize_channel`: aligned (clean ids, private ids) rows at one η or a band of η,
  several repeats each -- I/O-free.
* :func:`check_aligned` and :func:`encode_rows`: what every channel model (the denoiser, the
  channel adapter) does to such rows before reading them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from rapt.noise import NoiseSource
from rapt.privacy.mechanism import Privatizer, tokenize_texts

__all__ = ["PUBLIC_SOURCES", "ChannelCorpus", "ChannelPairs", "check_aligned", "check_disjoint",
           "encode_rows", "eta_band", "privatize_channel",
           "public_corpus_for", "special_wrap", "task_family"]

# Every split of each built-in family, by family; a family's text is never public for itself.
_FAMILY_SPLITS: dict[str, tuple[tuple[str, str], ...]] = {
    "sst2": (("sst2-sentences", "train"), ("sst2-sentences", "dev"),
             ("sst2-sentences", "test")),
    "financial_phrasebank": (("financial_phrasebank", "train"), ("financial_phrasebank", "dev"),
                             ("financial_phrasebank", "test")),
    "trec": (("trec", "train"), ("trec", "test")),
    "cb": (("cb", "train"), ("cb", "val"), ("cb", "test")),
    "trustpilot": (("trustpilot", "a"), ("trustpilot", "b")),
}
_ALIASES = {"sst2": "sst2", "sst-2": "sst2", "sst2-sentences": "sst2",
            "financial_phrasebank": "financial_phrasebank", "fp": "financial_phrasebank",
            "trec": "trec", "cb": "cb", "trustpilot": "trustpilot", "user": "user"}
# Public corpus per evaluation task: every other family (SST-2: TREC, FP, CB, TrustPilot;
# FP: SST-2 sentences, TREC, CB, TrustPilot).
PUBLIC_SOURCES: dict[str, tuple[tuple[str, str], ...]] = {
    task: tuple(s for fam, splits in _FAMILY_SPLITS.items() if fam != task for s in splits)
    for task in _FAMILY_SPLITS
}
# A user's own file belongs to no built-in family: every built-in split is public for it.
PUBLIC_SOURCES["user"] = tuple(s for splits in _FAMILY_SPLITS.values() for s in splits)


def task_family(task: str) -> str:
    """The built-in family a task name belongs to (``"fp"`` -> ``"financial_phrasebank"``)."""
    fam = _ALIASES.get(str(task).lower())
    if fam is None:
        raise ValueError(f"unknown evaluation task {task!r}; known: "
                         f"{', '.join(sorted(_ALIASES))}")
    return fam


@dataclass(frozen=True)
class ChannelCorpus:
    """Public texts and where they came from.

    ``sources``: one dict per (dataset, split): ``name``, ``split``, ``rows``;
    ``disjoint_from``: the evaluation task whose text is excluded; ``rows``: token ids per
    text once :meth:`tokenize` has run (``tokenizer`` names the tokenizer).
    """

    texts: tuple[str, ...]
    sources: tuple[dict, ...]
    disjoint_from: str
    rows: tuple[tuple[int, ...], ...] | None = None
    tokenizer: str | None = None

    def tokenize(self, tokenizer) -> ChannelCorpus:
        """The same corpus with token ids (no special tokens added)."""
        rows = tuple(tuple(r) for r in tokenize_texts(list(self.texts), tokenizer))
        name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
        return replace(self, rows=rows, tokenizer=str(name))

    @property
    def n_tokens(self) -> int | None:
        return None if self.rows is None else sum(len(r) for r in self.rows)

    def provenance(self) -> dict:
        """JSON-ready record for artifact meta."""
        return {"kind": "public text", "disjoint_from": self.disjoint_from,
                "sources": [dict(s) for s in self.sources], "n_texts": len(self.texts),
                "n_tokens": self.n_tokens, "tokenizer": self.tokenizer,
                "note": "rapt's built-in datasets other than the evaluation task; a real "
                        "deployment would use a general web or encyclopedic corpus"}


def check_disjoint(provenance: dict, task: str) -> None:
    """Raise ValueError unless a channel corpus's ``provenance`` (:meth:`ChannelCorpus.
    provenance`) excludes ``task``'s text: a channel model evaluated on text it was trained on
    would overstate both the attacker and the remedy."""
    fam = task_family(task)
    own = [f"{s.get('name')}/{s.get('split')}" for s in provenance.get("sources") or ()
           if _ALIASES.get(str(s.get("name")).lower()) == fam]
    if own or provenance.get("disjoint_from") != fam:
        raise ValueError(f"the channel corpus is disjoint from "
                         f"{provenance.get('disjoint_from')!r}, not from {fam!r}"
                         + (f" (it holds {', '.join(own)})" if own else "")
                         + f"; train one for this task ({fam})")


def public_corpus_for(task: str, *, sources: Sequence[tuple[str, str]] | None = None,
                      max_rows_per_source: int | None = None, seed: int = 0) -> ChannelCorpus:
    """Public corpus disjoint from ``task`` (default sources: :data:`PUBLIC_SOURCES`).

    Reads rapt's built-in datasets through :func:`rapt.data.load_dataset` (text and, for CB,
    the hypothesis too).  ``max_rows_per_source`` takes a seeded subset of each split.
    Refuses any source of the task's own family."""
    from rapt.data import load_dataset

    fam = task_family(task)
    chosen = tuple(PUBLIC_SOURCES[fam] if sources is None else sources)
    for name, _split in chosen:
        if _ALIASES.get(str(name).lower(), name) == fam:
            raise ValueError(f"{name!r} is the evaluation task's own text ({task}); a public "
                             "corpus must be disjoint from it")
    texts: list[str] = []
    record = []
    for name, split in chosen:
        ds = load_dataset(name, split)
        if max_rows_per_source is not None and len(ds) > max_rows_per_source:
            ds = ds.subset(max_rows_per_source, seed=seed)
        got = [t for t in ds.texts if t] + [t for t in ds.text_pairs if t]
        texts.extend(got)
        record.append({"name": name, "split": split, "rows": len(ds), "texts": len(got)})
    return ChannelCorpus(tuple(texts), tuple(record), fam)


def eta_band(lo: float, hi: float, n: int) -> list[float]:
    """``n`` η values spaced geometrically from ``lo`` to ``hi`` (P moves with log η)."""
    if not (0 < lo <= hi) or n < 1:
        raise ValueError(f"need 0 < lo <= hi and n >= 1, got {lo}, {hi}, {n}")
    if n == 1:
        return [math.sqrt(lo * hi)]
    r = math.log(hi / lo)
    return [lo * math.exp(r * i / (n - 1)) for i in range(n)]


@dataclass
class ChannelPairs:
    """Aligned privatized copies of public rows: ``clean[i]`` and ``private[i]`` have equal
    length; ``eta[i]`` is the η row i was privatized at; ``source_row[i]`` its corpus row."""

    clean: list[list[int]]
    private: list[list[int]]
    eta: list[float]
    source_row: list[int]
    meta: dict = field(default_factory=dict)

    def padded(self, pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
        """(clean (N, L), private (N, L), lengths (N,)) long tensors, right-padded."""
        n, L = len(self.clean), max((len(r) for r in self.clean), default=0)
        clean = torch.full((n, L), int(pad_id), dtype=torch.long)
        priv = clean.clone()
        for i, (c, p) in enumerate(zip(self.clean, self.private, strict=True)):
            clean[i, :len(c)] = torch.tensor(c, dtype=torch.long)
            priv[i, :len(p)] = torch.tensor(p, dtype=torch.long)
        return clean, priv, torch.tensor([len(r) for r in self.clean], dtype=torch.long)


def privatize_channel(rows: Sequence[Sequence[int]], privatizer: Privatizer,
                      etas: Sequence[float] | float | None = None, *, repeats: int = 1,
                      noise: NoiseSource | None = None) -> ChannelPairs:
    """Privatize every row at each η of ``etas`` (default: the privatizer's η), ``repeats``
    times each, in one vectorized call; η ≠ privatizer.eta goes through its per-token
    ``eta_scale``.  Returns len(rows)·len(etas)·repeats aligned pairs, η-major."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    etas = [privatizer.eta] if etas is None else (
        [float(etas)] if isinstance(etas, (int, float)) else [float(e) for e in etas])
    if not etas or any(not math.isfinite(e) or e <= 0 for e in etas):
        raise ValueError(f"etas must be positive and finite, got {etas}")
    rows = [list(map(int, r)) for r in rows]
    flat = torch.tensor([i for r in rows for i in r], dtype=torch.long)
    lengths = [len(r) for r in rows]
    copies = [(e, k) for e in etas for k in range(repeats)]
    ids = flat.repeat(len(copies))
    scale = torch.tensor([e / privatizer.eta for e, _ in copies],
                         dtype=torch.float64).repeat_interleave(flat.numel())
    priv = privatizer.privatize_ids(ids, eta_scale=scale, noise=noise).cpu()
    private = [r.tolist() for r in torch.split(priv, lengths * len(copies))]
    meta = {"etas": etas, "repeats": repeats, "n_rows": len(rows) * len(copies),
            "n_tokens": int(ids.numel()), "p": privatizer.last_stats.get("p"),
            "seeded": privatizer.seeded, "mode": privatizer.mode}
    return ChannelPairs(rows * len(copies), private,
                        [e for e, _ in copies for _ in rows],
                        list(range(len(rows))) * len(copies), meta)


def check_aligned(clean_rows: Sequence[Sequence[int]],
                  private_rows: Sequence[Sequence[int]]) -> None:
    """ValueError unless the rows are non-empty, equally many and of equal lengths pairwise
    (dχ privatization is token for token, so positions align)."""
    if len(clean_rows) != len(private_rows):
        raise ValueError(f"{len(clean_rows)} clean rows but {len(private_rows)} private rows")
    bad = [i for i, (c, p) in enumerate(zip(clean_rows, private_rows, strict=True))
           if len(c) != len(p)]
    if bad:
        raise ValueError(f"clean and private rows must be aligned token by token; row {bad[0]} "
                         f"has {len(clean_rows[bad[0]])} vs {len(private_rows[bad[0]])} tokens")
    if not clean_rows:
        raise ValueError("no training pairs")


def special_wrap(tokenizer) -> tuple[list[int], list[int]]:
    """([CLS], [SEP]) ids where the tokenizer has both, else ([], [])."""
    if tokenizer.cls_token_id is not None and tokenizer.sep_token_id is not None:
        return [int(tokenizer.cls_token_id)], [int(tokenizer.sep_token_id)]
    return [], []


def encode_rows(tokenizer, rows: Sequence[Sequence[int]],
                max_length: int) -> tuple[Tensor, Tensor, int]:
    """Text-only id rows -> (ids (N, L), mask (N, L), offset of the rows' first token): each row
    cut to what fits in ``max_length`` and wrapped by :func:`special_wrap`, right-padded."""
    head, tail = special_wrap(tokenizer)
    room = max_length - len(head) - len(tail)
    enc = [head + [int(t) for t in r[:room]] + tail for r in rows]
    n = max((len(e) for e in enc), default=0)
    ids = torch.full((len(enc), n), int(tokenizer.pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(enc), n), dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, :len(e)] = torch.tensor(e, dtype=torch.long)
        mask[i, :len(e)] = 1
    return ids, mask, len(head)

