"""Nearest-neighbour search: exact == brute force, fast (certified) == exact, annoy works."""

from __future__ import annotations

import pytest
import torch

from rapt.privacy.nn_search import AnnoyIndex, ExactIndex, FastIndex, build_index


def _brute(queries: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    return torch.cdist(queries.double(), vectors.double()).argmin(1)


def _data(V=3000, d=48, N=700, noise=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, d, generator=g) * (0.5 + torch.rand(V, 1, generator=g))
    ids = torch.randint(0, V, (N,), generator=g)
    y = W[ids] + noise * torch.randn(N, d, generator=g)
    return W, y


@pytest.mark.parametrize("noise", [0.05, 0.5, 1.0, 3.0])
def test_exact_matches_brute_force(noise):
    W, y = _data(noise=noise)
    assert torch.equal(ExactIndex(W).search(y), _brute(y, W))


def test_exact_vocab_tiling_is_identical():
    W, y = _data(V=1000, N=300)
    full = ExactIndex(W).search(y)
    tiled = ExactIndex(W, vocab_tile=97, max_scores=5000)
    assert tiled.batch == 51
    assert torch.equal(tiled.search(y), full)


@pytest.mark.parametrize("noise", [0.05, 0.5, 1.0, 3.0, 30.0])
def test_fast_equals_exact_and_brute_force(noise):
    W, y = _data(noise=noise)
    fast = FastIndex(W, block=32, batch=128, bf16=True)
    got = fast.search(y)
    assert torch.equal(got, ExactIndex(W).search(y))
    assert torch.equal(got, _brute(y, W))
    st = fast.stats
    assert st["queries"] == y.shape[0] == st["certified"] + st["fallback"]


def test_fast_certifies_most_queries_and_few_candidates():
    W, y = _data(V=4000, d=64, N=512, noise=1.0)
    fast = FastIndex(W, bf16=True)
    fast.search(y)
    assert fast.stats["certified"] / fast.stats["queries"] > 0.95
    # The bound must be tight enough to prune: few exact re-scores per query.
    assert fast.stats["candidates"] / fast.stats["certified"] < 50


def test_fast_fallback_is_exact():
    W, y = _data(V=800, N=200, noise=1.0)
    fast = FastIndex(W, block=16, max_blocks=0, bf16=True)  # every query fails its certificate
    assert torch.equal(fast.search(y), _brute(y, W))
    assert fast.stats["fallback"] == 200 and fast.stats["certified"] == 0


def test_fast_all_positive_scores_fall_back_to_exact():
    # Vectors far from the origin, queries at it: every score ||w||² − 2 y·w is > 0, the case
    # the int16 block-minimum shortcut cannot certify; the answer must still be exact.
    g = torch.Generator().manual_seed(0)
    W = 5.0 + torch.rand(500, 8, generator=g)
    y = 0.01 * torch.randn(50, 8, generator=g)
    fast = FastIndex(W, block=32, bf16=True)
    assert torch.equal(fast.search(y), _brute(y, W))
    assert fast.stats["fallback"] == 50


def test_fast_handles_vocab_not_multiple_of_block_and_duplicates():
    W, y = _data(V=1001, N=300, noise=0.3)
    W[500] = W[10]  # exact duplicate: ties go to the smaller index in both modes
    y[:5] = W[10]
    fast = FastIndex(W, block=128, bf16=True).search(y)
    exact = ExactIndex(W).search(y)
    assert torch.equal(fast, exact)
    assert (fast[:5] == 10).all()


def test_without_native_bf16_the_fast_index_runs_the_exact_scan(monkeypatch):
    """On a CPU that emulates bfloat16 (AVX2 only) the bfloat16 matmul is slower than the
    float32 scan it is meant to spare, so the index runs that scan; it decides by the CPU."""
    import rapt.precision as precision

    W, y = _data(V=600, N=100, noise=1.0)
    for native in (False, True):
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda native=native: native)
        fast = FastIndex(W, block=32)
        assert fast.use_exact_only is (not native)
        assert torch.equal(fast.search(y), _brute(y, W))
        assert fast.stats["certified"] + fast.stats["fallback"] == 100
        assert (fast.stats["candidates"] == 0) is (not native)
    assert FastIndex(W, bf16=True).use_exact_only is False


def test_annoy_finds_clean_vectors():
    W, _ = _data(V=500, d=16)
    idx = AnnoyIndex(W, n_trees=10)
    found = idx.search(W[:100] + 1e-4)
    assert (found == torch.arange(100)).float().mean() > 0.95


def test_build_index_and_errors():
    W, y = _data(V=100, N=10)
    assert isinstance(build_index(W, "exact"), ExactIndex)
    assert isinstance(build_index(W, "fast"), FastIndex)
    with pytest.raises(ValueError, match="unknown search mode"):
        build_index(W, "hnsw")
    with pytest.raises(ValueError, match="queries must be"):
        ExactIndex(W).search(y[:, :5])
    with pytest.raises(ValueError, match="NaN"):
        ExactIndex(torch.full((3, 2), float("nan")))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_exact_matches_cpu():
    W, y = _data(noise=1.0)
    gpu = ExactIndex(W.cuda()).search(y.cuda()).cpu()
    assert (gpu == ExactIndex(W).search(y)).float().mean() > 0.999
    assert (FastIndex(W.cuda()).search(y.cuda()).cpu() == gpu).all()


@pytest.mark.integration
def test_fast_equals_exact_on_minilm():
    from rapt.models import load_backbone
    from rapt.noise import NoiseSource
    from rapt.privacy.mechanism import sample_noise

    E = load_backbone("minilm").embeddings.detach()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, E.shape[0], (768,), generator=g)
    for eta in (60.0, 150.0):
        y = E[ids] + sample_noise(len(ids), E.shape[1], eta, NoiseSource(0))
        fast = FastIndex(E, bf16=True)
        assert torch.equal(fast.search(y), ExactIndex(E).search(y))
        assert fast.stats["certified"] / fast.stats["queries"] > 0.98
