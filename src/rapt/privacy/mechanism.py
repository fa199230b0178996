"""Text-to-text privatization with dχ-privacy (Feyisetan et al. 2020; RAPT §3.1, eqs 1-3).

Each token embedding x (d dims) gets noise z = l·v with l ~ Gamma(shape d, scale 1/η) and v
uniform on the unit sphere, i.e. density ∝ exp(−η‖z‖); the token is replaced by the vocabulary
token whose embedding is nearest (Euclidean) to x + z.  The nearest-neighbour step is
post-processing of x + z, so any candidate vocabulary and any search method keep the guarantee
P[M(x)=w] ≤ exp(η‖x−x'‖)·P[M(x')=w]; an *approximate* search does, however, change which token
comes out, and with it the measured replacement probability P.

Randomness: noise comes from a :class:`rapt.noise.NoiseSource`: the OS CSPRNG unless a seed is
passed explicitly. With a seed, the k-th perturbed token's noise depends only on the seed and k
(it is drawn in fixed blocks of ``NOISE_BLOCK`` tokens), so ``chunk_size`` changes memory use and
speed but never the output.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from rapt.config import ETA_MAX, ETA_MIN, eta_problem
from rapt.noise import NoiseSource
from rapt.privacy.nn_search import MODES, NNIndex, SearchMode, build_index

__all__ = [
    "NOISE_BLOCK",
    "PIECES",
    "PrivatizedTexts",
    "Privatizer",
    "calibrate_eta",
    "calibrate_eta_public",
    "candidate_ids_from_tokenizer",
    "detokenize",
    "public_sample_ids",
    "measure_p",
    "kind_figures",
    "privacy_line",
    "privacy_report",
    "privatize_texts",
    "privatize_texts_detailed",
    "replacement_probability",
    "sample_noise",
    "tokenize_texts",
]

NOISE_BLOCK = 1024
_UNUSED = re.compile(r"^(\[unused\d+\]|<unused\d+>|<\|reserved_special_token_\d+\|>)$")


def _check_eta(eta: float) -> float:
    eta = float(eta)
    problem = eta_problem(eta)
    if problem:
        raise ValueError(f"eta {problem}")
    return eta


def sample_noise(n: int, d: int, eta: float | Tensor, noise: NoiseSource | None = None,
                 *, device: torch.device | str | None = None) -> Tensor:
    """Draw n noise vectors z = l·v (float32, (n, d)) with density ∝ exp(−η‖z‖).

    ``eta`` is a scalar or a per-row tensor (n,).  l = Gamma(d, 1) / η ~ Gamma(d, scale 1/η);
    v = g/‖g‖ with g ~ N(0, I_d), uniform on the sphere. ``noise`` defaults to OS entropy.
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    noise = noise if noise is not None else NoiseSource()
    if not isinstance(noise, NoiseSource):
        raise TypeError(f"noise must be a rapt.noise.NoiseSource, got {type(noise).__name__} "
                        "(privacy noise no longer takes a torch.Generator: pass "
                        "NoiseSource(seed) for a repeatable run)")
    gamma = noise.gamma(float(d), n, device=dev)
    # Only the direction g/‖g‖ is used and only a nearest token is released, so the
    # sum-of-draws defence of Gaussian-mechanism noise buys nothing here (1/4 of the bits).
    g = noise.normal((n, d), device=dev, dtype=torch.float32, secure=False)
    v = g / g.norm(dim=1, keepdim=True)
    eta_t = torch.as_tensor(eta, dtype=torch.float64, device=dev)
    return ((gamma / eta_t).to(torch.float32)).unsqueeze(1) * v


_SHARED: list[tuple] = []  # the last index built by shared_index: (table copy, candidates, mode)


def shared_index(embeddings: Tensor, candidate_ids: Tensor | None, mode: SearchMode) -> NNIndex:
    """The nearest-neighbour index over the ``candidate_ids`` rows of ``embeddings`` (all rows
    for None), built once for consecutive callers with the same table, candidates and mode:
    η's calibration and the privatizer that follows it share one build (about a second for a
    30k-token vocabulary). A hit needs a table equal, value for value, to a copy taken at the
    build (a few milliseconds), so no change of the table, however made, reuses a stale
    index. Its search counters start from zero for each caller."""
    cand = None if candidate_ids is None else torch.as_tensor(candidate_ids).to(
        embeddings.device)
    table = embeddings.detach()
    if _SHARED:
        (t, c, m, index) = _SHARED[0]
        if (m == mode and t.shape == table.shape and t.dtype == table.dtype
                and t.device == table.device and torch.equal(t, table)
                and ((c is None and cand is None) or (c is not None and cand is not None
                                                     and torch.equal(c, cand)))):
            for name in index.stats:
                index.stats[name] = 0
            return index
    vecs = table if cand is None else table[cand]
    index = build_index(vecs.float(), mode)
    _SHARED[:] = [(table.clone(), None if cand is None else cand.clone(), mode, index)]
    return index


class Privatizer:
    """dχ-privacy text-to-text mechanism over one embedding matrix.

    ``embeddings``: (V, d) input-embedding matrix; ``eta``: privacy parameter (smaller = more
    noise); ``special_ids``: tokens that pass through unchanged; ``candidate_ids``: vocabulary
    rows allowed as outputs (default all; see :func:`candidate_ids_from_tokenizer`); ``mode``:
    "exact" (float32 full scan), "fast" (certified exact, see
    :class:`rapt.privacy.nn_search.FastIndex`) or "annoy" (approximate reference); ``chunk_size``:
    tokens noised and searched per step
    (bounds memory together with the index's own batching); ``seed``: makes the noise
    repeatable (tests, benchmarks) and marks the run ``seeded``; None (default) draws from the
    OS CSPRNG, as any real use must.
    """

    def __init__(self, embeddings: Tensor, eta: float, *, special_ids: Sequence[int] = (),
                 candidate_ids: Tensor | Sequence[int] | None = None,
                 mode: SearchMode = "exact", chunk_size: int = 4096,
                 device: torch.device | str | None = None, seed: int | None = None,
                 index: NNIndex | None = None, **index_options) -> None:
        if embeddings.dim() != 2:
            raise ValueError(f"embeddings must be (V, d), got shape {tuple(embeddings.shape)}")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.eta = _check_eta(eta)
        self.device = torch.device(device) if device is not None else embeddings.device
        self.embeddings = embeddings.detach().to(self.device, torch.float32).contiguous()
        V = self.embeddings.shape[0]
        self.special_ids = torch.tensor(sorted({int(i) for i in special_ids}), dtype=torch.long,
                                        device=self.device)
        if candidate_ids is None:
            self.candidate_ids = None
        else:
            cand = torch.as_tensor(candidate_ids, dtype=torch.long).flatten().unique()
            cand = cand.to(self.device)
            if cand.numel() == 0:
                raise ValueError("candidate_ids is empty")
            if int(cand.min()) < 0 or int(cand.max()) >= V:
                raise ValueError(f"candidate_ids must lie in [0, {V}); got {int(cand.min())}.."
                                 f"{int(cand.max())}")
            self.candidate_ids = cand
        self.chunk_size = int(chunk_size)
        n_out = V if self.candidate_ids is None else int(self.candidate_ids.numel())
        if index is None and not index_options:
            index = shared_index(self.embeddings, self.candidate_ids, mode)
        elif index is None:
            vecs = (self.embeddings if self.candidate_ids is None
                    else self.embeddings[self.candidate_ids])
            index = build_index(vecs, mode, **index_options)
        elif index.size != n_out or index.dim != self.dim:
            raise ValueError(f"index holds {index.size}x{index.dim} vectors but the candidate "
                             f"vocabulary is {n_out}x{self.dim}")
        self.index = index
        self.mode = index.mode  # a shared, prebuilt index decides the search
        self.seed = seed
        self.noise = NoiseSource(seed)
        self._redaction = self.noise.derive("eta-0 draws")  # see _redacted
        self.last_stats: dict[str, float] = {}

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    def _perturbable(self, ids: Tensor) -> Tensor:
        if self.special_ids.numel() == 0:
            return torch.ones_like(ids, dtype=torch.bool)
        return ~torch.isin(ids, self.special_ids)

    def _check_ids(self, ids: Tensor) -> Tensor:
        ids = torch.as_tensor(ids)
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise TypeError(f"ids must be an integer tensor, got {ids.dtype}")
        ids = ids.to(self.device, torch.long)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.embeddings.shape[0]):
            raise ValueError(f"token ids must lie in [0, {self.embeddings.shape[0]}); got "
                             f"{int(ids.min())}..{int(ids.max())}")
        return ids

    def _etas(self, eta_scale: Tensor | None, shape: torch.Size, mask: Tensor) -> Tensor | None:
        if eta_scale is None:
            return None
        scale = torch.as_tensor(eta_scale, dtype=torch.float64, device=self.device)
        if scale.shape != shape:
            raise ValueError(f"eta_scale must have the ids' shape {tuple(shape)}, got "
                             f"{tuple(scale.shape)}")
        scale = scale[mask]
        if scale.numel() and not (torch.isfinite(scale).all() and (scale >= 0).all()):
            raise ValueError("eta_scale must be finite and non-negative")
        return scale * self.eta

    def _redacted(self, flat: Tensor, etas: Tensor | None, noise: NoiseSource | None
                  ) -> tuple[Tensor, Tensor | None]:
        """η 0 (a scale of 0): dχ's limit, a release that does not depend on the token. Each
        such token is swapped for one drawn uniformly from the output vocabulary, which is then
        noised at the full η like any other. Without ``noise`` the draws come from a stream of
        their own, so the k-th token's noise is the same with or without tokens at η 0; a
        ``noise`` given serves them too, ahead of the noise (a source shared by many calls must
        go on, not restart)."""
        if etas is None or not bool((zero := etas == 0).any()):
            return flat, etas
        pool = self._outputs()
        source = noise if noise is not None else self._redaction
        flat, etas = flat.clone(), etas.clone()
        pick = source.integers(pool.numel(), int(zero.sum())).to(self.device)
        flat[zero] = pool[pick]
        etas[zero] = self.eta
        return flat, etas

    def _outputs(self) -> Tensor:
        """The ids a release can hold: the candidates, else every id but the specials."""
        if self.candidate_ids is not None:
            return self.candidate_ids
        every = torch.arange(self.embeddings.shape[0], device=self.device)
        return every[self._perturbable(every)]

    @property
    def seeded(self) -> bool:
        return self.noise.seeded

    def _noised_rows(self, ids: Tensor, etas: Tensor | None, noise: NoiseSource,
                     start: int, stop: int, blocks: dict) -> Tensor:
        """x + z for flat positions start:stop of ``ids`` (perturbable tokens only).

        Noise comes in NOISE_BLOCK-sized blocks drawn in order, so the k-th token's noise never
        depends on the chunking; ``blocks`` caches the current block across chunks.
        """
        d = self.dim
        parts = []
        pos = start
        while pos < stop:
            b = pos // NOISE_BLOCK
            if blocks.get("index") != b:
                n = min(NOISE_BLOCK, ids.numel() - b * NOISE_BLOCK)
                blocks["index"] = b
                blocks["noise"] = sample_noise(n, d, 1.0, noise, device=self.device)
            hi = min(stop, (b + 1) * NOISE_BLOCK)
            parts.append(blocks["noise"][pos - b * NOISE_BLOCK: hi - b * NOISE_BLOCK])
            pos = hi
        unit = torch.cat(parts) if len(parts) > 1 else parts[0]  # noise at η = 1
        scale = (1.0 / etas[start:stop] if etas is not None
                 else torch.full((stop - start,), 1.0 / self.eta, dtype=torch.float64,
                                 device=self.device))
        return self.embeddings[ids[start:stop]] + unit * scale.to(torch.float32).unsqueeze(1)

    def noised_embeddings(self, ids: Tensor, *, eta_scale: Tensor | None = None,
                          noise: NoiseSource | None = None) -> Tensor:
        """x + z for every token of ``ids`` (any shape) -> (*ids.shape, d) float32.

        Special tokens keep their clean embedding.  This is what the SAP user sends.
        """
        ids = self._check_ids(ids)
        gen = noise or self.noise
        mask = self._perturbable(ids)
        etas = self._etas(eta_scale, ids.shape, mask)
        flat, etas = self._redacted(ids[mask], etas, noise)
        out = self.embeddings[ids].clone()
        blocks: dict = {}
        rows = [self._noised_rows(flat, etas, gen, s, min(s + self.chunk_size, flat.numel()),
                                  blocks) for s in range(0, flat.numel(), self.chunk_size)]
        if rows:
            out[mask] = torch.cat(rows)
        return out

    def privatize_ids(self, ids: Tensor, *, eta_scale: Tensor | None = None,
                      noise: NoiseSource | None = None,
                      progress: Callable[[int], None] | None = None,
                      passthrough: Tensor | None = None) -> Tensor:
        """Privatized token ids, same shape as ``ids``; special ids pass through unchanged.

        ``eta_scale`` (same shape as ids) multiplies η per token (CTI: > 1 = less noise; 0:
        the token is swapped for a uniform draw before the noise, see :meth:`_redacted`).
        ``passthrough`` (bool, same shape): non-special positions released unchanged (CTI's
        multiplier ∞). They still take their slot of the noise stream and discard it, so the
        k-th non-special position's noise is the same whichever positions pass through: with
        one seed, SAP and SAP-CTI outputs agree on every position that is not passed through.
        ``progress`` is called with the number of tokens finished after each chunk.
        """
        ids = self._check_ids(ids)
        gen = noise or self.noise
        mask = self._perturbable(ids)
        etas = self._etas(eta_scale, ids.shape, mask)
        flat = ids[mask]
        skip = self._passthrough(passthrough, ids.shape, mask)
        source, etas = self._redacted(flat, etas, noise)
        out_flat = flat.clone()
        blocks: dict = {}
        t0 = time.perf_counter()
        for s in range(0, flat.numel(), self.chunk_size):
            e = min(s + self.chunk_size, flat.numel())
            y = self._noised_rows(source, etas, gen, s, e, blocks)
            live = torch.arange(s, e, device=self.device)
            if skip is not None:
                live = live[~skip[s:e]]
                y = y[live - s]
            if live.numel():
                found = self.index.search(y).to(self.device)
                out_flat[live] = (found if self.candidate_ids is None
                                  else self.candidate_ids[found])
            if progress is not None:
                progress(e - s)
        out = ids.clone()
        out[mask] = out_flat
        dt = time.perf_counter() - t0
        noised = flat if skip is None else flat[~skip]
        changed = out_flat if skip is None else out_flat[~skip]
        n = int(noised.numel())
        self.last_stats = {"tokens": n, "seconds": dt, "tokens_per_s": n / dt if dt > 0 else 0.0,
                           "p": float((changed != noised).float().mean()) if n else 0.0}
        return out

    def _passthrough(self, passthrough: Tensor | None, shape: torch.Size, mask: Tensor
                     ) -> Tensor | None:
        """The ``passthrough`` mask over the perturbable positions (flat), or None."""
        if passthrough is None:
            return None
        skip = torch.as_tensor(passthrough, device=self.device)
        if skip.dtype != torch.bool or skip.shape != shape:
            raise ValueError(f"passthrough must be a bool tensor of the ids' shape "
                             f"{tuple(shape)}, got {skip.dtype} {tuple(skip.shape)}")
        return skip[mask]


def candidate_ids_from_tokenizer(tokenizer, vocab_size: int | None = None, *,
                                 exclude_special: bool = True,
                                 exclude_unused: bool = True) -> Tensor:
    """Vocabulary ids allowed as privatized outputs: all ids below ``vocab_size`` (embedding
    rows; default ``len(tokenizer)``) that the tokenizer knows, minus special tokens and
    reserved placeholders such as BERT's ``[unused17]``.  Returns a sorted LongTensor."""
    n = len(tokenizer) if vocab_size is None else min(int(vocab_size), len(tokenizer))
    drop: set[int] = set()
    if exclude_special:
        drop.update(int(i) for i in tokenizer.all_special_ids)
    if exclude_unused:
        for tok, i in tokenizer.get_vocab().items():
            if _UNUSED.match(tok):
                drop.add(int(i))
    keep = [i for i in range(n) if i not in drop]
    if not keep:
        raise ValueError("no candidate tokens left after excluding special and unused tokens")
    return torch.tensor(keep, dtype=torch.long)


def replacement_probability(original_ids: Tensor | Sequence[Sequence[int]],
                            private_ids: Tensor | Sequence[Sequence[int]],
                            special_ids: Sequence[int] = ()) -> float:
    """P = fraction of non-special token positions whose id changed (0.0 when there are none).

    Accepts tensors of equal shape or lists of equal-length id lists."""
    a, b = _flatten_ids(original_ids), _flatten_ids(private_ids)
    if a.shape != b.shape:
        raise ValueError(f"original and private ids differ in length: {a.numel()} vs {b.numel()}")
    mask = ~torch.isin(a, torch.tensor(list(special_ids), dtype=torch.long))
    n = int(mask.sum())
    return float((a[mask] != b[mask]).sum()) / n if n else 0.0


def _flatten_ids(ids) -> Tensor:
    if isinstance(ids, Tensor):
        return ids.detach().cpu().long().flatten()
    flat: list[int] = []
    for row in ids:
        flat.extend(int(i) for i in row)
    return torch.tensor(flat, dtype=torch.long)


def tokenize_texts(texts: Sequence[str], tokenizer) -> list[list[int]]:
    """Token ids of each text without added special tokens (what gets privatized)."""
    if not texts:
        return []
    enc = tokenizer(list(texts), add_special_tokens=False)
    return [list(x) for x in enc["input_ids"]]


PIECES = ("join", "split")  # how detokenize writes a WordPiece "##" piece


def detokenize(tokenizer, ids: Sequence[int], pieces: str = "join") -> str:
    """The text of released token ids: a function of the ids alone, never of the original text
    or of which tokens were replaced (spacing that followed the original words, or the
    replaced tokens, would tell a reader where the original tokens are -- what the inversion
    attacker looks for -- and the release would no longer be post-processing of the mechanism).

    WordPiece vocabularies (the BERT family: ``##`` marks a piece that continues a word):
    ``"join"`` glues a piece to the word token before it, as the tokenizer's own decoding does,
    so the text tokenizes back to the released pieces wherever WordPiece's greedy match allows;
    a piece the mechanism drew at a word's position then makes a non-word ("great" + "##aint"
    -> "greataint"). ``"split"`` writes every piece as a word of its own ("great aint"): no
    glued non-words, but a piece that did continue its word is split off too ("play ing"), and
    read back it becomes a whole-word token, not the piece released. Either way a piece with no
    word before it (text start, after punctuation or a special token) is written without its
    ``##``. Other vocabularies (byte-level BPE marks word starts on the token itself): the
    tokenizer's decoding. An uncased vocabulary (minilm's) has lower-case tokens only, so its
    output is lower-case: that is the text the backbone reads.
    """
    if pieces not in PIECES:
        raise ValueError(f"pieces must be one of {', '.join(PIECES)}, got {pieces!r}")
    ids = [int(i) for i in ids]
    toks = tokenizer.convert_ids_to_tokens(ids)
    if not any(t.startswith("##") for t in toks):
        return tokenizer.decode(ids, clean_up_tokenization_spaces=True)
    special = set(tokenizer.all_special_tokens)
    words: list[str] = []
    for t in toks:
        if not (t.startswith("##") and len(t) > 2):
            words.append(t)
            continue
        prev = words[-1] if words else ""
        if pieces == "join" and prev and prev not in special and prev[-1].isalnum():
            words[-1] = prev + t[2:]
        else:
            words.append(t[2:])
    return tokenizer.clean_up_tokenization(" ".join(words))


@dataclass
class PrivatizedTexts:
    """Result of :func:`privatize_texts_detailed`: texts, original and private ids, P."""

    texts: list[str]
    original_ids: list[list[int]]
    private_ids: list[list[int]]
    p: float
    stats: dict = field(default_factory=dict)
    classes: list[list[int]] | None = None  # each token's class, when privatized by kind


def privatize_texts_detailed(texts: Sequence[str], tokenizer, privatizer: Privatizer, *,
                             token_eta_scale: Tensor | None = None,
                             noise: NoiseSource | None = None,
                             progress: Callable[[int], None] | None = None,
                             pieces: str = "join",
                             eta_scale: Sequence[Tensor] | None = None,
                             passthrough: Sequence[Tensor] | None = None) -> PrivatizedTexts:
    """Privatize each text token by token; returns texts (:func:`detokenize` with ``pieces``),
    ids and the measured P.

    ``token_eta_scale`` is an optional per-vocabulary η multiplier (V,) (e.g. from CTI).
    ``eta_scale`` / ``passthrough``: one tensor per text over its tokens, as
    :func:`rapt.privacy.by_kind.row_noise` makes them (noise by kind of token)."""
    if not texts:
        return PrivatizedTexts([], [], [], 0.0, {})
    orig = tokenize_texts(texts, tokenizer)
    lengths = [len(x) for x in orig]
    flat = torch.tensor([i for row in orig for i in row], dtype=torch.long)
    scale = clear = None
    if token_eta_scale is not None:
        scale = torch.as_tensor(token_eta_scale, dtype=torch.float64)[flat]
    if eta_scale is not None:
        per = torch.cat([torch.as_tensor(t, dtype=torch.float64) for t in eta_scale])
        scale = per if scale is None else scale * per
    if passthrough is not None:
        clear = torch.cat([torch.as_tensor(t, dtype=torch.bool) for t in passthrough])
    priv_flat = privatizer.privatize_ids(flat, eta_scale=scale, noise=noise,
                                         progress=progress, passthrough=clear).cpu()
    priv = [row.tolist() for row in torch.split(priv_flat, lengths)]
    out_texts = [detokenize(tokenizer, row, pieces) for row in priv]
    p = replacement_probability(flat, priv_flat, privatizer.special_ids.tolist())
    return PrivatizedTexts(out_texts, orig, priv, p, dict(privatizer.last_stats))


def privatize_texts(texts: Sequence[str], tokenizer, privatizer: Privatizer, *,
                    token_eta_scale: Tensor | None = None,
                    noise: NoiseSource | None = None,
                    progress: Callable[[int], None] | None = None) -> list[str]:
    """Privatized version of each text (token ids -> decoded string)."""
    return privatize_texts_detailed(texts, tokenizer, privatizer, token_eta_scale=token_eta_scale,
                                    noise=noise, progress=progress).texts


def measure_p(embeddings: Tensor, eta: float, sample_ids: Tensor | Sequence[int],
              special_ids: Sequence[int] = (), *, candidate_ids: Tensor | None = None,
              mode: SearchMode = "exact", seed: int = 0, index: NNIndex | None = None) -> float:
    """Replacement probability P at ``eta`` on the tokens ``sample_ids`` (one seeded run)."""
    ids = torch.as_tensor(sample_ids, dtype=torch.long).flatten()
    priv = Privatizer(embeddings, eta, special_ids=special_ids, candidate_ids=candidate_ids,
                      mode=mode, seed=seed, index=index)
    return replacement_probability(ids, priv.privatize_ids(ids).cpu(), special_ids)


def calibrate_eta(embeddings: Tensor, target_p: float, sample_ids: Tensor | Sequence[int],
                  special_ids: Sequence[int] = (), *, candidate_ids: Tensor | None = None,
                  mode: SearchMode = "exact", seed: int = 0, tol: float = 0.005,
                  max_iter: int = 40, eta0: float = 100.0) -> float:
    """η whose measured P on ``sample_ids`` is within ``tol`` of ``target_p``.

    Every evaluation reuses the same seed, so the noise directions and Gamma draws are shared
    and only their scale 1/η changes: the noised point moves along a fixed ray away from x, and
    since x's Voronoi cell is convex, each token's "replaced" indicator -- hence P -- is
    non-increasing in η.  That makes a bisection on log η well defined.  The result is as good
    as the sample: with n tokens, P itself has a standard error of about sqrt(P(1−P)/n).
    """
    if not 0.0 < target_p < 1.0:
        raise ValueError(f"target_p must lie strictly between 0 and 1, got {target_p}")
    ids = torch.as_tensor(sample_ids, dtype=torch.long).flatten()
    if candidate_ids is not None:  # the order the privatizer maps found rows back through
        candidate_ids = torch.as_tensor(candidate_ids, dtype=torch.long).flatten().unique()
    index = shared_index(embeddings.detach().float().contiguous(), candidate_ids, mode)

    def p_at(eta: float) -> float:
        return measure_p(embeddings, eta, ids, special_ids, candidate_ids=candidate_ids,
                         mode=mode, seed=seed, index=index)

    lo = hi = float(eta0)
    p = p_at(eta0)
    if abs(p - target_p) <= tol:
        return eta0
    # Bracket: P(lo) >= target >= P(hi), expanding by 4x per step within [ETA_MIN, ETA_MAX].
    if p > target_p:
        while p > target_p:
            if hi >= ETA_MAX:
                raise ValueError(f"P stays above {target_p} for every η up to {ETA_MAX:g} (is "
                                 "the candidate set missing the inputs' own tokens?)")
            lo, hi = hi, min(hi * 4.0, ETA_MAX)
            p = p_at(hi)
    else:
        while p < target_p:
            if lo <= ETA_MIN:
                raise ValueError(f"P stays below {target_p} for every η down to {ETA_MIN:g}")
            hi, lo = lo, max(lo / 4.0, ETA_MIN)
            p = p_at(lo)
    for _ in range(max_iter):
        mid = math.sqrt(lo * hi)
        p = p_at(mid)
        if abs(p - target_p) <= tol or hi / lo < 1.0 + 1e-4:
            return mid
        if p > target_p:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def public_sample_ids(tokenizer, special_ids: Sequence[int] = ()) -> Tensor:
    """Token ids (1-D) of the public English sample bundled with rapt
    (``rapt/resources/public_sample.txt``: reviews, support requests, news, clinical notes,
    written for this project), specials removed. Calibrating η on it, not on the user's rows,
    keeps the private data out of the choice of η: the same η then means the same P for
    everyone with the same backbone."""
    from importlib.resources import files

    text = files("rapt").joinpath("resources/public_sample.txt").read_text(encoding="utf-8")
    special = {int(i) for i in special_ids}
    ids = [i for row in tokenize_texts(text.splitlines(), tokenizer) for i in row
           if i not in special]
    return torch.tensor(ids, dtype=torch.long)


def calibrate_eta_public(backbone, target_p: float, *, candidate_ids: Tensor | None = None,
                         mode: SearchMode = "fast", tol: float = 0.005) -> float:
    """η for replacement probability ``target_p`` measured on the bundled public sample
    (:func:`public_sample_ids`), never on private rows. Every command calls this with the
    defaults (the tokenizer's candidate tokens, the certified-exact "fast" search), so the same
    ``--target-p`` gives the same η everywhere for one backbone, whatever search the mechanism
    then uses. The P measured on a user's own text will differ by the sample's standard error
    and by how the text differs from the sample.

    The bisection takes seconds at every command's start, so its result is kept in a small
    cache file (:func:`_eta_cache_path`), keyed by a digest of everything it depends on
    (embedding table, candidates, sample, specials, target, mode, tolerance). A cached η is
    used only after one measurement on the sample confirms P within ``tol`` of the target: a
    stale or edited file costs a new calibration, never a wrong η."""
    if candidate_ids is None:
        candidate_ids = candidate_ids_from_tokenizer(backbone.tokenizer,
                                                     backbone.embeddings.shape[0])
    sample = public_sample_ids(backbone.tokenizer, backbone.special_ids)
    emb, special = backbone.embeddings, backbone.special_ids
    key = _eta_cache_key(emb, candidate_ids, sample, special, target_p, mode, tol)

    def on_target(eta: float) -> bool:
        p = measure_p(emb, eta, sample, special, candidate_ids=candidate_ids, mode=mode)
        return abs(p - target_p) <= tol

    cached = _eta_cache_get(key)
    if cached is not None and on_target(cached):
        return cached
    eta = calibrate_eta(emb, target_p, sample, special, candidate_ids=candidate_ids, mode=mode,
                        tol=tol)
    # Kept without measuring again: a bisection that ended short of the target fails the
    # check above on the next read and is calibrated anew (to the same η: it is seeded).
    _eta_cache_put(key, eta)
    return eta


def _eta_cache_path() -> Path:
    """``eta_calibration.json`` in rapt's local cache (``$RAPT_CACHE``, default
    ``~/.cache/rapt``, as the client's)."""
    return Path(os.environ.get("RAPT_CACHE") or Path.home() / ".cache" / "rapt") / (
        "eta_calibration.json")


def _eta_cache_key(emb: Tensor, candidate_ids, sample: Tensor, special_ids, target_p: float,
                   mode: str, tol: float) -> str:
    h = hashlib.sha256()
    h.update(repr((tuple(emb.shape), float(target_p), mode, float(tol),
                   sorted(int(i) for i in special_ids))).encode())
    for t in (emb.detach().float().contiguous(), torch.as_tensor(candidate_ids), sample):
        h.update(t.cpu().numpy().tobytes())
    return h.hexdigest()


def _eta_cache_get(key: str) -> float | None:
    try:
        eta = json.loads(_eta_cache_path().read_text()).get(key)
    except (OSError, ValueError, AttributeError):  # no cache, unreadable, not a JSON object
        return None
    return float(eta) if isinstance(eta, int | float) and 0 < eta < math.inf else None


def _eta_cache_put(key: str, eta: float) -> None:
    """Add ``key``: η to the cache file, atomically; a cache that cannot be written is
    skipped (it only saves time)."""
    path = _eta_cache_path()
    try:
        doc = json.loads(path.read_text()) if path.is_file() else {}
        doc = doc if isinstance(doc, dict) else {}
        doc[key] = float(eta)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass


def privacy_report(original_ids: Tensor | Sequence[Sequence[int]],
                   private_ids: Tensor | Sequence[Sequence[int]], privatizer: Privatizer, *,
                   target_p: float | None = None,
                   classes: Sequence[Sequence[int]] | None = None,
                   frequent_rank: int | None = None) -> dict:
    """The privacy of one release, measured where the text is (never sent): η, the replacement
    probability P (share of non-special tokens that changed) and the success rate of the
    nearest-neighbour inversion attack (``rapt.privacy.inversion``) by an attacker who holds the
    same embeddings and candidate vocabulary. ``target_p``: the P that η was calibrated for
    on the public sample, recorded alongside.

    With ``classes`` (each position's index into :data:`rapt.privacy.by_kind.CLASSES`, aligned
    with the rows) the same figures per kind of token go under ``by_kind``
    (:func:`rapt.privacy.kind_recovery.privacy_by_class`: all, rare, personal and frequent
    words, ``frequent_rank`` drawing the line); without, ``by_kind`` is None."""
    from rapt.privacy.by_kind import DEFAULT_FREQUENT_RANK
    from rapt.privacy.inversion import inversion_attack
    from rapt.privacy.kind_recovery import privacy_by_class

    orig, priv = _flatten_ids(original_ids), _flatten_ids(private_ids)
    special = privatizer.special_ids.cpu().tolist()
    inv = inversion_attack(orig, privatizer.embeddings, private_ids=priv, special_ids=special,
                           candidate_ids=privatizer.candidate_ids, index=privatizer.index)
    by_kind = None
    if classes is not None:
        flat = [int(c) for row in classes for c in row]
        by_kind = privacy_by_class(orig.tolist(), priv.tolist(),
                                   inv.recovered.flatten().tolist(), flat, special,
                                   frequent_rank=frequent_rank or DEFAULT_FREQUENT_RANK)
    return {"eta": privatizer.eta, "replacement_probability": replacement_probability(
                orig, priv, special),
            "inversion_success": inv.success_rate, "n_tokens": inv.n_tokens,
            "target_p": target_p,
            "eta_calibrated_on": "rapt public sample" if target_p is not None else None,
            "mode": privatizer.mode, "seeded": privatizer.seeded, "by_kind": by_kind}


def privacy_line(report: dict) -> str:
    """One line for a :func:`privacy_report`: η, measured P, inversion success, and beside it
    the rare-word and personal-data privacy (:func:`kind_figures`)."""
    from rapt.numfmt import eta, p

    calibrated = (f" (calibrated for P ≈ {report['target_p']:g} on rapt's public text sample)"
                  if report.get("target_p") is not None else "")
    return (f"privacy: η = {eta(report['eta'])}{calibrated}; measured P = "
            f"{p(report['replacement_probability'])} of {report['n_tokens']:,} tokens replaced; "
            f"nearest-neighbour inversion recovers {report['inversion_success']:.1%}; "
            f"{kind_figures(report.get('by_kind'))}")


KIND_LABELS = {"rare": "rare-word privacy", "personal": "personal-data privacy"}


def kind_figures(by_kind: dict | None) -> str:
    """"rare-word privacy 0.652 (nearest neighbour, 310 tokens); personal-data privacy ..."
    from a report's ``by_kind`` (empirical privacy: 1 − the best recovery of the attackers run
    on those tokens); a kind with no token says so; no ``by_kind`` says it was not measured."""
    if not by_kind:
        return ("rare-word and personal-data privacy not measured (the rows' texts were not "
                "given)")
    parts = []
    for kind, label in KIND_LABELS.items():
        fig = by_kind.get(kind) or {}
        n = int(fig.get("n_tokens") or 0)
        if fig.get("empirical_privacy") is None:
            parts.append(f"{label}: no such tokens")
        else:
            parts.append(f"{label} {fig['empirical_privacy']:.3f} ({fig['attacker']}, "
                         f"{n:,} token{'s' if n != 1 else ''})")
    return "; ".join(parts)
