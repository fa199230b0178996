"""Privatized token reconstruction (RAPT §3.2.2, eqs. 6-7): plain tokens, rows, head,
loss and its objective.

Row layout (the one convention every RAPT caller shares)::

    [leading specials] k_1 .. k_m  x_1 .. x_n  [trailing specials]
    e.g. BERT:  [CLS] k x [SEP]        Llama (no BOS added): k x        Llama with BOS: <s> k x

Sentence pairs (a, b) fill x as the tokenizer pairs them when its pair template puts something
between the texts (BERT: ``[CLS] k a [SEP] b [SEP]``); a tokenizer that just concatenates them
(GPT-2 style BPE, e.g. SmolLM2) gets ``a`` newline ``b``: the texts joined by a newline token,
privatized like the text. Truncation shortens the longer text first and keeps both.

The plain tokens k start at ``plain_offset(tokenizer)`` = the number of special tokens the
tokenizer puts before the text (1 for BERT's [CLS]). The user side builds such rows with
:func:`build_rows` and privatizes every token except specials with :func:`privatize_rows`; the
provider sees only the privatized rows and the public plain tokens k (the reconstruction targets).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rapt.noise import NoiseSource
from rapt.training.loop import ModelOutput

_UNUSED = re.compile(r"^(\[unused\d+\]|<unused\d+>|<\|.*\|>|<.*>|\[.*\])$")


def _template(tokenizer) -> tuple[list[int], list[int]]:
    """(ids before, ids after) the text in the tokenizer's single-text template: where the
    bare tokenization of a probe text lies inside its tokenization with specials. (Counting
    leading special ids instead would also count an [UNK] for a probe word missing from the
    vocabulary.)"""
    with_specials = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    for n in range(len(with_specials) - len(bare) + 1):
        if with_specials[n:n + len(bare)] == bare:
            return with_specials[:n], with_specials[n + len(bare):]
    raise ValueError("cannot locate the text inside the tokenizer's special-token template")


def plain_offset(tokenizer) -> int:
    """How many special tokens the tokenizer puts before the text (where k starts)."""
    return len(_template(tokenizer)[0])


def pairs_separated(tokenizer) -> bool:
    """True when the tokenizer's pair template puts tokens between the two texts (BERT's
    [SEP]); False when it just concatenates them (GPT-2 style BPE), which would fuse them."""
    before, _ = _template(tokenizer)
    a = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    b = list(tokenizer("b", add_special_tokens=False)["input_ids"])
    pair = list(tokenizer("a", "b", add_special_tokens=True)["input_ids"])
    start = len(before) + len(a)
    return pair[start:start + len(b)] != b


def _longest_first(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Cut tokens off the end of the longer of a, b until both fit in ``budget`` (what the
    tokenizers' ``truncation="longest_first"`` does); neither is dropped entirely."""
    if budget < 2:
        raise ValueError(f"max_length leaves {budget} tokens for a sentence pair; need >= 2")
    la, lb = len(a), len(b)
    while la + lb > budget:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return a[:la], b[:lb]


def encode_texts(tokenizer, texts: Sequence[str],
                 text_pairs: Sequence[str | None] | None = None,
                 max_length: int | None = None) -> list[list[int]]:
    """Texts (and second texts of sentence pairs; all None = single texts) -> token id rows
    with the tokenizer's specials, at most ``max_length`` ids each (None: no truncation).
    Pairs are encoded as the module docstring says; their truncation cuts the longer text
    first."""
    texts = list(texts)
    cut = {} if max_length is None else {"truncation": True, "max_length": max_length}
    # Dataset.text_pairs is all None for single texts: callers pass it either way.
    if text_pairs is None or all(p is None for p in text_pairs):
        return [list(r) for r in tokenizer(texts, add_special_tokens=True, **cut)["input_ids"]]
    pairs = list(text_pairs)
    if len(pairs) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(pairs)} second texts of pairs")
    if any(p is None for p in pairs):
        raise ValueError("every text of a pair dataset needs its second text (got None)")
    if pairs_separated(tokenizer):
        if max_length is not None:
            cut["truncation"] = "longest_first"
        return [list(r) for r in
                tokenizer(texts, pairs, add_special_tokens=True, **cut)["input_ids"]]
    before, after = _template(tokenizer)
    # A tokenizer that strips whitespace tokenizes "\n" to nothing: its EOS marks the
    # boundary then (a special, so it stays in clear like BERT's [SEP]).
    sep = list(tokenizer("\n", add_special_tokens=False)["input_ids"])
    if not sep and tokenizer.eos_token_id is not None:
        sep = [int(tokenizer.eos_token_id)]
    first = tokenizer(texts, add_special_tokens=False)["input_ids"]
    second = tokenizer(pairs, add_special_tokens=False)["input_ids"]
    rows = []
    for a, b in zip(first, second, strict=True):
        a, b = list(a), list(b)
        if max_length is not None:
            a, b = _longest_first(a, b, max_length - len(before) - len(after) - len(sep))
        rows.append(before + a + sep + b + after)
    return rows


def candidate_plain_ids(tokenizer) -> list[int]:
    """Vocabulary ids that may serve as plain tokens: not special, not [unusedN]/<...> markers,
    and decoding to some visible text."""
    special = set(tokenizer.all_special_ids)
    vocab = tokenizer.get_vocab()
    out = []
    for tok, i in vocab.items():
        if i in special or _UNUSED.match(tok):
            continue
        if not tokenizer.convert_tokens_to_string([tok]).strip():
            continue
        out.append(int(i))
    return sorted(out)


def sample_plain_tokens(tokenizer, m: int = 40, seed: int = 0,
                        num_sequences: int = 1) -> list[int] | list[list[int]]:
    """m plain tokens drawn uniformly from :func:`candidate_plain_ids` (with a seed: they are
    public, not privacy noise); ``num_sequences > 1`` returns that many sequences (RAPT
    Figure 4a)."""
    if m < 1:
        raise ValueError(f"plain-token length must be >= 1, got {m}")
    pool = torch.tensor(candidate_plain_ids(tokenizer))
    g = torch.Generator().manual_seed(seed)
    seqs = [pool[torch.randint(len(pool), (m,), generator=g)].tolist()
            for _ in range(num_sequences)]
    return seqs[0] if num_sequences == 1 else seqs


def parse_plain_tokens(tokenizer, text: str) -> list[int]:
    """User-given plain tokens as text (e.g. RAPT Table 8's list) -> ids."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("plain tokens: the given text tokenizes to nothing")
    return list(ids)


def build_rows(tokenizer, texts: Sequence[str], max_length: int | None = 128,
               plain_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
               plain_index: Sequence[int] | None = None,
               text_pairs: Sequence[str | None] | None = None) -> list[list[int]]:
    """Tokenize texts (or sentence pairs ``texts[i]``, ``text_pairs[i]``) into rows of at most
    ``max_length`` ids (None: no limit), with the plain tokens inserted after the leading
    specials. With several plain sequences, ``plain_index[i]`` picks row i's. The text (not k)
    is truncated when the row would be too long."""
    seqs = _as_sequences(plain_ids)
    m = len(seqs[0]) if seqs else 0
    if m and max_length is not None and max_length <= m + 2:
        raise ValueError(f"max_length {max_length} leaves no room for {m} plain tokens")
    enc = encode_texts(tokenizer, texts, text_pairs,
                       None if max_length is None else max_length - m)
    if not seqs:
        return enc
    off = plain_offset(tokenizer)
    rows = []
    for i, r in enumerate(enc):
        k = seqs[plain_index[i] if plain_index is not None else 0]
        rows.append(list(r[:off]) + list(k) + list(r[off:]))
    return rows


def text_length_for(tokenizer, texts: Sequence[str], fraction: float = 0.95) -> tuple[int, float]:
    """The smallest row length (specials included, plain tokens not) that keeps ``fraction`` of
    the rows whole -> (length in tokens, fraction actually kept whole). Comparing settings at
    this text length plus m for the rows with k truncates the text identically in all of them."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must lie in (0, 1] (got {fraction})")
    if len(texts) == 0:
        raise ValueError("text_length_for needs at least one text")
    lens = sorted(len(r) for r in tokenizer(list(texts), add_special_tokens=True)["input_ids"])
    n = lens[min(len(lens) - 1, math.ceil(fraction * len(lens)) - 1)]
    return n, sum(1 for x in lens if x <= n) / len(lens)


def drop_plain(rows: Sequence[Sequence[int]], tokenizer, m: int) -> list[list[int]]:
    """Rows built with m plain tokens -> the same rows without them. The dχ mechanism noises
    every token independently, so cutting k out of a privatized row gives a row privatized
    exactly as if it had been built without k: settings compared on the same draw are paired."""
    off = plain_offset(tokenizer)
    return [list(r[:off]) + list(r[off + m:]) for r in rows]


def _as_sequences(plain_ids) -> list[list[int]]:
    if plain_ids is None or len(plain_ids) == 0:
        return []
    first = plain_ids[0]
    if not (isinstance(first, list | tuple) or (isinstance(first, Tensor) and first.dim() > 0)):
        return [[int(t) for t in plain_ids]]
    seqs = [[int(t) for t in s] for s in plain_ids]
    if len({len(s) for s in seqs}) != 1:
        raise ValueError("all plain-token sequences must have the same length m")
    return seqs


def privatize_rows(rows: Sequence[Sequence[int]], privatizer,
                   noise: NoiseSource | None = None, *,
                   eta_scale: Sequence[torch.Tensor] | None = None,
                   passthrough: Sequence[torch.Tensor] | None = None) -> list[list[int]]:
    """Privatize every token of every row (the privatizer passes its special ids through).
    All rows go through one ``privatize_ids`` call on the concatenated ids (no padding needed).
    ``eta_scale`` / ``passthrough``: one tensor per row, as ``privatize_ids`` takes them
    (:func:`rapt.privacy.by_kind.row_noise` makes them)."""
    lengths = [len(r) for r in rows]
    if not rows:
        return []
    flat = torch.tensor([t for r in rows for t in r], dtype=torch.long)
    for name, per_row in (("eta_scale", eta_scale), ("passthrough", passthrough)):
        if per_row is not None and [len(x) for x in per_row] != lengths:
            raise ValueError(f"{name} must hold one entry per token of every row")
    scale = torch.cat(list(eta_scale)) if eta_scale is not None else None
    clear = torch.cat(list(passthrough)) if passthrough is not None else None
    if clear is not None and not bool(clear.any()):
        clear = None
    out = privatizer.privatize_ids(flat, noise=noise, eta_scale=scale,
                                   passthrough=clear).tolist()
    res, i = [], 0
    for n in lengths:
        res.append(out[i:i + n])
        i += n
    return res


def _unique_plain(plain_ids) -> list[int]:
    plain: list[int] = []
    for s in _as_sequences(plain_ids):
        for t in s:
            if t not in plain:
                plain.append(t)
    return plain


def rec_vocabulary(rows: Sequence[Sequence[int]], plain_ids, size: int = 7630,
                   special_ids: Sequence[int] = ()) -> list[int]:
    """The reconstruction head's vocabulary T: every plain token first, then the most frequent
    non-special tokens of the (privatized) training rows, ``size`` ids in all (fewer when the
    rows hold fewer distinct tokens). Targets are always plain tokens, so no target falls outside
    T; the frequent tokens are the distractors of the softmax, as in the paper.

    Not for DP training: T (and its length) depends on the training rows, so neighbouring
    datasets would train different loss functions; use :func:`public_rec_vocabulary` there."""
    plain = _unique_plain(plain_ids)
    skip = set(special_ids) | set(plain)
    counts = Counter(t for r in rows for t in r if t not in skip)
    extra = [t for t, _ in counts.most_common(max(0, size - len(plain)))]
    return plain + extra


def public_rec_vocabulary(tokenizer, plain_ids, size: int = 7630) -> list[int]:
    """T from public information only (for DP training): the plain tokens, then the
    tokenizer's usable tokens (:func:`candidate_plain_ids`) in vocabulary order, ``size`` ids in
    all, or every usable token when the vocabulary is smaller. Vocabulary order is the
    tokenizer's own ranking (BERT WordPiece lists frequent words early, BPE ranks by merges),
    and neither T nor its length depends on the training data."""
    plain = _unique_plain(plain_ids)
    seen = set(plain)
    extra = [t for t in candidate_plain_ids(tokenizer) if t not in seen]
    return plain + extra[:max(0, size - len(plain))]


class ReconstructionHead(nn.Module):
    """Eq. 6: p_i = softmax(W1 W2 g_i), W2: h -> c, W1: c -> |T| (no bias, no non-linearity)."""

    def __init__(self, hidden_size: int, rec_hidden: int, rec_vocab_size: int) -> None:
        super().__init__()
        self.down = nn.Linear(hidden_size, rec_hidden, bias=False)  # W2
        self.up = nn.Linear(rec_hidden, rec_vocab_size, bias=False)  # W1

    def forward(self, plain_states: Tensor) -> Tensor:
        """(B, m, h) -> logits (B, m, |T|)."""
        return self.up(self.down(plain_states))


def reconstruction_loss(logits: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
    """Per-example eq. 7: (B, m, |T|), (B, m) -> (B,). ``sum`` is the paper's −Σ_i log p_i[j_i];
    ``mean`` divides by m so the weight does not grow with the number of plain tokens."""
    nll = nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return nll.sum(1) if reduction == "sum" else nll.mean(1)


@dataclass
class Reconstruction:
    """RAPT's L_rec (eq. 7): predict each row's plain tokens from their hidden states.

    ``targets`` (S, m): the plain sequences as indices into the reconstruction vocabulary T;
    ``sequence`` (N,): which of them example i holds."""

    targets: Tensor
    sequence: Tensor
    weight: float = 1.0
    reduction: str = "mean"

    def __call__(self, out: ModelOutput, idx: Tensor) -> tuple[Tensor, dict[str, Tensor]] | None:
        if out.rec is None:
            return None
        tgt = self.targets[self.sequence[idx]].to(out.rec.device)
        r = reconstruction_loss(out.rec.float(), tgt, self.reduction)
        return r, {"rec_loss": r.detach(), "rec_acc": (out.rec.argmax(-1) == tgt).float()}
