"""Nearest-neighbour search over a vocabulary embedding matrix (Euclidean), used by dχ-privacy.

Three indexes share one interface, ``index.search(queries (N, d)) -> LongTensor (N,)``:

* :class:`ExactIndex` -- full scan: ``argmin_w ||w||² − 2 y·w`` as float32 matmuls over batches
  of queries and tiles of the vocabulary (memory bounded by ``max_scores`` score entries).
* :class:`FastIndex` -- certified exact search.  A bfloat16 matmul scores the whole vocabulary
  at ~3× the float32 speed on CPUs with AVX512-BF16; a rigorous bound on the bfloat16 error
  (input rounding, float32 accumulation and output rounding) selects the few vocabulary blocks
  that can still hold the true nearest neighbour, and only those are re-scored in float32.
  The result equals the exact search unless a query's candidate set is too large, in which
  case that query falls back to the full float32 scan ("certificate failure", in ``stats``).
* :class:`AnnoyIndex` -- the ``annoy`` approximate index (random projection trees) that public
  dχ-privacy code uses; kept as a reference.  It is built for clean vectors and misses the
  nearest neighbour of noised ones: measure its recall before trusting it.

Ties are broken towards the smallest vocabulary index in the exact and fast modes.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Literal

import torch
from torch import Tensor

SearchMode = Literal["exact", "fast", "annoy"]
MODES: tuple[str, ...] = ("exact", "fast", "annoy")

_U32 = 2.0**-24  # float32 unit roundoff
# bfloat16 keeps 8 significant bits: round-to-nearest errs by <= 2^-8 relative, truncation by
# <= 2^-7.  We assume the weaker of the two for the matmul output, whose rounding we cannot see.
_RHO_OUT = 2.0**-7


class NNIndex(ABC):
    """Nearest-neighbour index over ``vectors`` (V, d); ``search`` returns row indices."""

    mode: str = ""

    def __init__(self, vectors: Tensor) -> None:
        if vectors.dim() != 2 or vectors.shape[0] == 0 or vectors.shape[1] == 0:
            raise ValueError(
                f"vectors must be a non-empty (V, d) matrix, got {tuple(vectors.shape)}")
        if not torch.isfinite(vectors).all():
            raise ValueError("vectors contain NaN or infinite values")
        self.vectors = vectors.detach().to(torch.float32).contiguous()
        self.device = self.vectors.device
        self.stats: dict[str, float] = {"queries": 0}

    @property
    def size(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def _check_queries(self, queries: Tensor) -> Tensor:
        if queries.dim() != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"queries must be (N, {self.dim}), got {tuple(queries.shape)}")
        return queries.detach().to(device=self.device, dtype=torch.float32)

    @abstractmethod
    def search(self, queries: Tensor) -> Tensor:
        """Index of the nearest vector for each query row: (N, d) -> LongTensor (N,)."""

    def reset_stats(self) -> None:
        self.stats = {"queries": 0}


class ExactIndex(NNIndex):
    """Exact full scan as float32 BLAS matmuls: ``argmin ||w||² − 2 y·w``.

    ``max_scores`` bounds the score buffer (queries × vocabulary tile) in entries; the default
    2^23 (32 MiB) batches ~270 queries per matmul against a 30k vocabulary, enough to run
    near the BLAS limit.
    """

    mode = "exact"

    def __init__(self, vectors: Tensor, *, max_scores: int = 2**23, vocab_tile: int = 65536):
        super().__init__(vectors)
        self.norms2 = self.vectors.pow(2).sum(1)  # (V,)
        self.vocab_tile = max(1, min(vocab_tile, self.size))
        self.batch = max(1, max_scores // self.vocab_tile)

    def scores(self, queries: Tensor, lo: int = 0, hi: int | None = None) -> Tensor:
        """||w||² − 2 y·w for vocabulary rows lo:hi (float32, shape (N, hi-lo))."""
        hi = self.size if hi is None else hi
        return torch.addmm(self.norms2[lo:hi], queries, self.vectors[lo:hi].t(), alpha=-2.0)

    def search(self, queries: Tensor) -> Tensor:
        y = self._check_queries(queries)
        out = torch.empty(y.shape[0], dtype=torch.long, device=self.device)
        for s in range(0, y.shape[0], self.batch):
            yb = y[s : s + self.batch]
            if self.vocab_tile >= self.size:
                out[s : s + yb.shape[0]] = self.scores(yb).argmin(1)
                continue
            best_v = torch.full((yb.shape[0],), math.inf, device=self.device)
            best_i = torch.zeros(yb.shape[0], dtype=torch.long, device=self.device)
            for lo in range(0, self.size, self.vocab_tile):
                v, i = self.scores(yb, lo, lo + self.vocab_tile).min(1)
                better = v < best_v  # strict: earlier tiles win ties (smallest index)
                best_v = torch.where(better, v, best_v)
                best_i = torch.where(better, i + lo, best_i)
            out[s : s + yb.shape[0]] = best_i
        self.stats["queries"] += int(y.shape[0])
        return out


class FastIndex(NNIndex):
    """Certified exact search: bfloat16 scoring + error bound + float32 re-scoring.

    The vocabulary is stored as bfloat16 rows ``[ŵ, b̂, 0…]`` (``b̂`` = bfloat16 of ``||w||²``)
    and each query as ``[2ŷ, −1, 0…]`` so a single bfloat16 matmul yields ``−ŝ_w``, approximate
    negated scores ``ŝ_w ≈ s_w = ||w||² − 2 y·w``.  For every query we bound ``|s_w − ŝ_w|`` by

        δ = 2(‖y−ŷ‖·max‖w‖ + ‖ŷ‖·max‖w−ŵ‖) + max|‖w‖²−b̂| + γ_K(2‖ŷ‖·max‖ŵ‖ + max b̂)

    plus the relative output rounding ρ|ŝ_w| (ρ = 2^-7), all norms computed exactly from the
    stored values.  Any w with ``ŝ_w − ρ'|ŝ_w| − δ`` above a float32-exact upper bound ``U`` on the
    minimum score cannot be the nearest neighbour.  Minima over vocabulary blocks of ``block``
    rows tell which blocks may hold a candidate; only their candidates are re-scored in float32.
    A query whose candidates span more than ``max_blocks`` blocks falls back to the full float32
    scan.  Results equal :class:`ExactIndex` except where two scores tie within float32
    rounding (the two compute them in a different order).  The bound assumes the bfloat16
    matmul accumulates in float32 (oneDNN/MKL on x86 do); on CUDA, where cuBLAS may reduce
    bfloat16 in reduced precision, this index simply runs the exact scan (fast there anyway).
    So it does on a CPU without native bfloat16 (no AVX512-BF16 or AMX: AVX2 only), where
    torch emulates the bfloat16 matmul: there it took 0.86 s against the float32 scan's 0.13 s
    (256 queries × 29,696 rows, one thread, an AMD EPYC with AVX2). ``bf16``: None decides by
    the CPU (:func:`rapt.precision.cpu_has_native_bf16`); True forces the bfloat16 path (the
    tests of its certificate run it on any CPU).
    """

    mode = "fast"

    def __init__(self, vectors: Tensor, *, block: int = 128, batch: int = 256,
                 max_blocks: int = 64, bf16: bool | None = None) -> None:
        from rapt.precision import cpu_has_native_bf16

        super().__init__(vectors)
        self.exact = ExactIndex(self.vectors)
        self.block, self.batch, self.max_blocks = int(block), int(batch), int(max_blocks)
        self.stats.update(certified=0, fallback=0, candidates=0)
        if bf16 is None:
            bf16 = self.device.type == "cpu" and cpu_has_native_bf16()
        self.use_exact_only = self.device.type != "cpu" or not bf16
        if self.use_exact_only:
            return
        V, d = self.vectors.shape
        self.n_blocks = -(-V // self.block)
        vp = self.n_blocks * self.block
        # K = d + 1 rounded up to a multiple of 32: odd inner sizes hit slow bf16 kernels.
        self.k = -(-(d + 1) // 32) * 32
        w64 = self.vectors.double()
        n2 = w64.pow(2).sum(1)
        wa = torch.zeros(vp, self.k, dtype=torch.bfloat16)
        wa[:V, :d] = self.vectors.to(torch.bfloat16)
        wa[:V, d] = n2.to(torch.bfloat16)
        # Padding rows score 1e30 so they never win a block minimum.
        wa[V:, d] = 1e30
        self.wa = wa
        w_hat = wa[:V, :d].double()
        b_hat = wa[:V, d].double()
        self.w_max = float(w64.norm(dim=1).max())
        self.w_err_max = float((w64 - w_hat).norm(dim=1).max())
        self.w_hat_max = float(w_hat.norm(dim=1).max())
        self.b_err_max = float((n2 - b_hat).abs().max())
        self.b_hat_max = float(b_hat.abs().max())
        ku = self.k * _U32
        self.gamma_k = ku / (1.0 - ku)
        # float32 error of one exact score (d products + bias), used as slack around U.
        du = (d + 2) * _U32
        self.gamma_d = du / (1.0 - du)

    def search(self, queries: Tensor) -> Tensor:
        y = self._check_queries(queries)
        if self.use_exact_only:
            out = self.exact.search(y)
            self.stats["queries"] += int(y.shape[0])
            self.stats["certified"] += int(y.shape[0])
            return out
        out = torch.empty(y.shape[0], dtype=torch.long)
        for s in range(0, y.shape[0], self.batch):
            out[s : s + self.batch] = self._search_batch(y[s : s + self.batch])
        self.stats["queries"] += int(y.shape[0])
        return out

    def _exact_scores(self, y_rows: Tensor, idx: Tensor) -> Tensor:
        """float32 scores of vocabulary rows idx (P,) for queries y_rows (P, d)."""
        w = self.vectors[idx]
        return self.exact.norms2[idx] - 2.0 * (w * y_rows).sum(1)

    def _search_batch(self, y: Tensor) -> Tensor:
        B, d = y.shape
        V, blk = self.size, self.block
        rows = torch.arange(B)
        ya = torch.zeros(B, self.k, dtype=torch.bfloat16)
        y_hat = y.to(torch.bfloat16)
        ya[:, :d] = y_hat * 2.0  # exact: scaling by a power of two
        ya[:, d] = -1.0
        neg = ya @ self.wa.t()  # (B, Vp) bfloat16 approximations of −s_w
        neg_blocks = neg.view(B, self.n_blocks, blk)
        # Block minima of ŝ through the int16 bit patterns of −ŝ: for non-negative bfloat16
        # values the integer order is the float order and negative values compare below all of
        # them, so an integer max is the block's max of −ŝ whenever the block holds some ŝ < 0.
        # (bfloat16 reductions are ~10x slower than this integer one.)  Blocks without a
        # negative ŝ decode to a wrong but non-negative value; they matter only for rows whose
        # threshold is >= 0, and those rows go to the exact scan below.
        bits = neg_blocks.view(torch.int16).amax(2)
        bmin = -bits.view(torch.bfloat16).double()  # (B, nb)

        # Upper bound U: the exact score of the approximate winner.
        b0 = bmin.argmin(1)
        w0 = b0 * blk + neg_blocks[rows, b0].argmax(1)
        u = self._exact_scores(y, w0).double()

        y64, yh64 = y.double(), y_hat.double()
        y_err = (y64 - yh64).norm(dim=1)
        yh_norm = yh64.norm(dim=1)
        y_norm = y64.norm(dim=1)
        delta = (2.0 * (y_err * self.w_max + yh_norm * self.w_err_max) + self.b_err_max
                 + self.gamma_k * (2.0 * yh_norm * self.w_hat_max + self.b_hat_max) + 1e-30)
        # U is a float32 value: the real scores of w0 and of the float32 winner are within
        # 3 float32 errors of it.
        slack = 3.0 * self.gamma_d * (2.0 * y_norm * self.w_max + self.w_max**2)
        v = u + slack + delta
        rho = _RHO_OUT / (1.0 - _RHO_OUT)
        # Candidate iff ŝ − ρ|ŝ| ≤ v; t ↦ t − ρ|t| is increasing, so invert it once per row.
        thr = torch.where(v >= 0, v / (1.0 - rho), v / (1.0 + rho))  # (B,)

        sel = bmin <= thr[:, None]  # (B, nb) blocks that may hold the winner
        ok = (sel.sum(1) <= self.max_blocks) & (thr < 0)
        out = torch.empty(B, dtype=torch.long)
        if not bool(ok.all()):
            bad = (~ok).nonzero().squeeze(1)
            out[bad] = self.exact.search(y[bad])
            sel[bad] = False
        r, b = sel.nonzero(as_tuple=True)
        cand = -neg_blocks[r, b].double() <= thr[r, None]  # (P, blk)
        pr, pc = cand.nonzero(as_tuple=True)
        cr = r[pr]
        cw = b[pr] * blk + pc
        keep = cw < V  # padding rows are never candidates, but be explicit
        cr, cw = cr[keep], cw[keep]
        sc = self._exact_scores(y[cr], cw)
        best = torch.full((B,), math.inf).scatter_reduce(0, cr, sc, "amin")
        is_best = sc == best[cr]
        win = torch.full((B,), V, dtype=torch.long).scatter_reduce(
            0, cr[is_best], cw[is_best], "amin")
        # A certified row always keeps its approximate winner as a candidate; rows left with
        # none would signal a broken bound, so they take the exact scan rather than a guess.
        empty = ok & (win >= V)
        if bool(empty.any()):
            out[empty] = self.exact.search(y[empty])
            ok = ok & ~empty
        out[ok] = win[ok]
        n_ok = int(ok.sum())
        self.stats["certified"] += n_ok
        self.stats["fallback"] += B - n_ok
        self.stats["candidates"] += int(cw.numel())
        return out


class AnnoyIndex(NNIndex):
    """Reference approximate index: ``annoy`` with ``n_trees`` random projection trees.

    One Python call per query, as in public dχ-privacy code.  Not certified: measure recall.
    """

    mode = "annoy"

    def __init__(self, vectors: Tensor, *, n_trees: int = 50, search_k: int = -1,
                 seed: int = 0) -> None:
        super().__init__(vectors)
        from annoy import AnnoyIndex as _Annoy

        self.search_k = search_k
        self.index = _Annoy(self.dim, "euclidean")
        self.index.set_seed(seed)
        for i, row in enumerate(self.vectors.cpu().numpy()):
            self.index.add_item(i, row)
        self.index.build(n_trees, n_jobs=1)

    def search(self, queries: Tensor) -> Tensor:
        y = self._check_queries(queries).cpu().numpy()
        found = [self.index.get_nns_by_vector(row, 1, search_k=self.search_k)[0] for row in y]
        self.stats["queries"] += len(found)
        return torch.tensor(found, dtype=torch.long, device=self.device)


def build_index(vectors: Tensor, mode: SearchMode = "exact", **options) -> NNIndex:
    """Build the index for ``mode`` ("exact", "fast" or "annoy") over ``vectors`` (V, d)."""
    if mode == "exact":
        return ExactIndex(vectors, **options)
    if mode == "fast":
        return FastIndex(vectors, **options)
    if mode == "annoy":
        return AnnoyIndex(vectors, **options)
    raise ValueError(f"unknown search mode {mode!r}; choose one of {', '.join(MODES)}")
