"""dχ-privacy mechanism: noise law, the dχ bound, P, seeds, specials, chunking, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from rapt.noise import NoiseSource
from rapt.privacy.mechanism import (
    Privatizer,
    calibrate_eta,
    candidate_ids_from_tokenizer,
    measure_p,
    privatize_texts,
    privatize_texts_detailed,
    replacement_probability,
    sample_noise,
)

_WORDS = (
    "[PAD] [UNK] [CLS] [SEP] [MASK] the a movie film good bad great awful boring fun plot actor "
    "story love hate is was not very really it this that and but of to in with funny sad dull "
    "brilliant terrible best worst ever one two time scene music long short fine nice poor weak"
).split()


@pytest.fixture(scope="module")
def tok():
    """~55-word WordPiece tokenizer (built from a dict: transformers 5 ignores vocab_file=)."""
    from transformers import BertTokenizerFast

    return BertTokenizerFast(vocab={w: i for i, w in enumerate(_WORDS)}, do_lower_case=True)


@pytest.fixture(scope="module")
def bert(tok):
    """rapt Backbone around a random 2-layer, 32-dim BERT over ``tok``."""
    from transformers import BertConfig, BertModel

    from rapt.models import from_model

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    return from_model(BertModel(cfg).eval(), tok, name="tiny-bert", kind="encoder")


def _emb(V=55, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, d, generator=g) * 0.1


# --- noise law ---------------------------------------------------------------------------------

@pytest.mark.parametrize("d,eta", [(1, 3.0), (16, 5.0), (384, 100.0)])
def test_noise_norm_is_gamma(d, eta):
    z = sample_noise(4000, d, eta, NoiseSource(1))
    norms = z.double().norm(dim=1).numpy()
    assert stats.kstest(norms, "gamma", args=(d, 0, 1.0 / eta)).pvalue > 0.001
    # The test has power: a noise scale off by 10% is rejected.
    if d > 1:
        assert stats.kstest(norms, "gamma", args=(d, 0, 1.1 / eta)).pvalue < 0.001


def test_noise_direction_is_uniform_on_sphere():
    d, n = 16, 4000
    z = sample_noise(n, d, 2.0, NoiseSource(2)).double()
    v = z / z.norm(dim=1, keepdim=True)
    # Mean direction ~ 0: each coordinate has variance 1/d, so the mean has s.d. 1/sqrt(n d).
    assert v.mean(0).abs().max() < 5 / math.sqrt(n * d)
    # v_1^2 ~ Beta(1/2, (d-1)/2) for a uniform direction; so is any fixed projection.
    assert stats.kstest(v[:, 0].pow(2).numpy(), "beta", args=(0.5, (d - 1) / 2)).pvalue > 0.001
    u = torch.randn(d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    proj = (v @ (u / u.norm())).pow(2).numpy()
    assert stats.kstest(proj, "beta", args=(0.5, (d - 1) / 2)).pvalue > 0.001
    # ... and it is independent of the norm (Spearman correlation ~ 0).
    assert abs(stats.spearmanr(z.norm(dim=1), v[:, 0].pow(2)).statistic) < 0.06


def test_noised_embeddings_have_gamma_norm_and_keep_specials():
    E = _emb(d=8)
    priv = Privatizer(E, 4.0, special_ids=[0, 2], seed=0)
    ids = torch.tensor([0, 5, 2] + [7] * 3000)
    y = priv.noised_embeddings(ids)
    assert y.shape == (len(ids), 8)
    assert torch.equal(y[[0, 2]], E[[0, 2]])
    norms = (y[3:] - E[7]).double().norm(dim=1).numpy()
    assert stats.kstest(norms, "gamma", args=(8, 0, 1 / 4.0)).pvalue > 0.001


# --- the dχ bound (eq. 1) ----------------------------------------------------------------------

def _cp_bounds(k: np.ndarray, n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Clopper-Pearson interval for k successes in n trials (per entry)."""
    lo = np.where(k > 0, stats.beta.ppf(alpha / 2, k, n - k + 1), 0.0)
    hi = np.where(k < n, stats.beta.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    return lo, hi


def _output_counts(priv: Privatizer, x: int, n: int, V: int) -> np.ndarray:
    out = priv.privatize_ids(torch.full((n,), x))
    return torch.bincount(out, minlength=V).numpy()


def test_dx_bound_on_tiny_vocabulary(tok):
    # Tiny vocabulary (the fixture's ~55 tokens) embedded in 2-D, where the bound is nearly
    # reached for tokens at the edge of the cloud; 30k samples per input.
    V = len(tok)
    E = _emb(V=V, d=2, seed=4)
    eta, n, alpha = 12.0, 30000, 1e-4
    priv = Privatizer(E, eta, seed=5)
    pairs = [(7, 8), (9, 30), (12, 40)]
    worst = 0.0
    for a, b in pairs:
        dist = float((E[a] - E[b]).norm())
        ca, cb = _output_counts(priv, a, n, V), _output_counts(priv, b, n, V)
        for c1, c2 in ((ca, cb), (cb, ca)):
            lo1, _ = _cp_bounds(c1, n, alpha / V)
            _, hi2 = _cp_bounds(c2, n, alpha / V)
            assert (lo1 <= math.exp(eta * dist) * hi2).all()
            seen = (c1 > 300) & (c2 > 300)
            worst = max(worst, float(np.max(np.log(c1[seen] / c2[seen]) / (eta * dist))))
    # Where counts are large, the observed log-ratio reaches a good fraction of η·d(x, x'), so
    # the check above is not vacuous (the bound itself is checked with intervals, not here).
    assert worst > 0.3


def test_dx_bound_is_tight_in_one_dimension():
    # d = 1, vocabulary {0, 1, 2, 3}: M(1) = 0 iff z < -1/2 and M(2) = 0 iff z < -3/2, so with
    # Laplace noise of rate η the ratio is exactly exp(η |1 - 2|).  A wrong noise law fails.
    E = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    eta, n = 2.0, 200000
    priv = Privatizer(E, eta, seed=6)
    c1 = int((priv.privatize_ids(torch.full((n,), 1)) == 0).sum())
    c2 = int((priv.privatize_ids(torch.full((n,), 2)) == 0).sum())
    p1, p2 = c1 / n, c2 / n
    assert p1 == pytest.approx(0.5 * math.exp(-0.5 * eta), rel=0.05)
    assert p2 == pytest.approx(0.5 * math.exp(-1.5 * eta), rel=0.08)
    # Delta method: s.e. of log(p1/p2) ~ sqrt(1/c1 + 1/c2).
    se = math.sqrt(1 / c1 + 1 / c2)
    assert abs(math.log(p1 / p2) - eta) < 4 * se


# --- P, seeds, specials, chunking --------------------------------------------------------------

def test_p_rises_as_eta_falls():
    E = _emb(V=200, d=16)
    ids = torch.arange(200).repeat(10)
    etas = [400.0, 200.0, 100.0, 50.0, 25.0, 10.0]
    ps = [measure_p(E, eta, ids, seed=0) for eta in etas]
    # Same seed = same directions and Gamma draws, only scaled by 1/η; Voronoi cells are
    # convex, so P is monotone path by path, not just on average.
    assert all(a <= b for a, b in zip(ps, ps[1:], strict=False)), ps
    assert ps[0] < 0.2 and ps[-1] > 0.8


def test_seed_reproduces_and_differs():
    E = _emb()
    ids = torch.randint(5, 55, (3, 40), generator=torch.Generator().manual_seed(0))
    a = Privatizer(E, 30.0, seed=11).privatize_ids(ids)
    b = Privatizer(E, 30.0, seed=11).privatize_ids(ids)
    c = Privatizer(E, 30.0, seed=12).privatize_ids(ids)
    assert a.shape == ids.shape and torch.equal(a, b) and not torch.equal(a, c)
    p = Privatizer(E, 30.0)
    assert torch.equal(p.privatize_ids(ids, noise=NoiseSource(3)),
                       p.privatize_ids(ids, noise=NoiseSource(3)))


def test_unseeded_noise_is_fresh_every_time():
    """Without a seed, two privatizers and two calls of one privatizer draw different noise.

    Mutations caught: seeding the unseeded source with 0 (two privatizers agree), and reusing
    one noise draw per privatizer (two calls agree)."""
    E = _emb()
    ids = torch.randint(5, 55, (3, 40), generator=torch.Generator().manual_seed(0))
    a, b = Privatizer(E, 30.0), Privatizer(E, 30.0)
    assert not a.seeded and Privatizer(E, 30.0, seed=0).seeded
    za, zb = a.noised_embeddings(ids), b.noised_embeddings(ids)
    assert not torch.equal(za, zb)
    assert not torch.equal(a.noised_embeddings(ids), za)
    assert not torch.equal(a.privatize_ids(ids), a.privatize_ids(ids))


def test_specials_untouched_and_never_produced(tok):
    V = len(tok)
    E = _emb(V=V)
    specials = tok.all_special_ids
    cand = candidate_ids_from_tokenizer(tok, V)
    assert not set(cand.tolist()) & set(specials)
    priv = Privatizer(E, 1.0, special_ids=specials, candidate_ids=cand, seed=0)
    enc = tok(["the movie was good", "bad plot"], padding="max_length",
                         max_length=12, return_tensors="pt")["input_ids"]
    out = priv.privatize_ids(enc)
    is_special = torch.isin(enc, torch.tensor(specials))
    assert torch.equal(out[is_special], enc[is_special])
    assert not torch.isin(out[~is_special], torch.tensor(specials)).any()
    assert (out[~is_special] != enc[~is_special]).float().mean() > 0.5  # η = 1: heavy noise


def test_candidate_ids_exclude_unused_tokens():
    class FakeTok:
        all_special_ids = [0, 1]

        def __len__(self):
            return 6

        def get_vocab(self):
            return {"[PAD]": 0, "[CLS]": 1, "[unused0]": 2, "[unused12]": 3, "a": 4, "b": 5}

    assert candidate_ids_from_tokenizer(FakeTok()).tolist() == [4, 5]
    assert candidate_ids_from_tokenizer(FakeTok(), exclude_unused=False).tolist() == [2, 3, 4, 5]
    assert candidate_ids_from_tokenizer(FakeTok(), vocab_size=5).tolist() == [4]


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_chunking_does_not_change_output(mode):
    E = _emb(V=300, d=24)
    ids = torch.randint(0, 300, (2500,), generator=torch.Generator().manual_seed(0))
    ref = Privatizer(E, 40.0, seed=3, mode=mode).privatize_ids(ids)
    for chunk in (1, 7, 1000, 1024, 5000):
        got = Privatizer(E, 40.0, seed=3, mode=mode, chunk_size=chunk).privatize_ids(ids)
        assert torch.equal(got, ref), chunk
    y1 = Privatizer(E, 40.0, seed=3, chunk_size=13).noised_embeddings(ids[:100])
    y2 = Privatizer(E, 40.0, seed=3).noised_embeddings(ids[:100])
    assert torch.equal(y1, y2)


def test_exact_fast_and_brute_force_agree():
    E = _emb(V=2000, d=32)
    ids = torch.randint(0, 2000, (3000,), generator=torch.Generator().manual_seed(1))
    for eta in (20.0, 80.0, 300.0):
        ex = Privatizer(E, eta, seed=4, mode="exact")
        fa = Privatizer(E, eta, seed=4, mode="fast")
        y = Privatizer(E, eta, seed=4).noised_embeddings(ids)
        brute = torch.cdist(y.double(), E.double()).argmin(1)
        assert torch.equal(ex.privatize_ids(ids), brute)
        assert torch.equal(fa.privatize_ids(ids), brute)


def test_eta_scale_per_token():
    E = _emb(V=100, d=16)
    ids = torch.arange(100).repeat(5)
    scale = torch.ones(len(ids))
    scale[:100] = 1e9  # practically no noise for the first copy
    out = Privatizer(E, 5.0, seed=0).privatize_ids(ids, eta_scale=scale)
    assert torch.equal(out[:100], ids[:100])
    assert (out[100:] != ids[100:]).float().mean() > 0.5
    with pytest.raises(ValueError, match="shape"):
        Privatizer(E, 5.0).privatize_ids(ids, eta_scale=torch.ones(3))
    with pytest.raises(ValueError, match="non-negative"):
        Privatizer(E, 5.0).privatize_ids(ids, eta_scale=-torch.ones(len(ids)))
    with pytest.raises(ValueError, match="finite"):
        Privatizer(E, 5.0).privatize_ids(ids, eta_scale=torch.full((len(ids),), float("inf")))


def test_bad_arguments():
    E = _emb()
    with pytest.raises(ValueError, match="eta"):
        Privatizer(E, 0.0)
    with pytest.raises(ValueError, match="eta"):
        Privatizer(E, float("nan"))
    with pytest.raises(ValueError, match="mode"):
        Privatizer(E, 1.0, mode="hnsw")
    with pytest.raises(ValueError, match=r"\[0, 55\)"):
        Privatizer(E, 1.0).privatize_ids(torch.tensor([99]))
    with pytest.raises(ValueError, match="candidate_ids"):
        Privatizer(E, 1.0, candidate_ids=[100])
    with pytest.raises(TypeError):
        Privatizer(E, 1.0).privatize_ids(torch.tensor([1.5]))


def test_replacement_probability():
    assert replacement_probability([[1, 2, 3], [4]], [[1, 9, 3], [5]]) == 0.5
    assert replacement_probability(torch.tensor([0, 2, 3]), torch.tensor([0, 9, 3]), [0]) == 0.5
    assert replacement_probability([[0]], [[0]], [0]) == 0.0
    with pytest.raises(ValueError):
        replacement_probability([[1, 2]], [[1]])


def test_calibrate_eta_hits_target():
    E = _emb(V=300, d=16)
    ids = torch.arange(300).repeat(4)
    for target in (0.1, 0.5, 0.9):
        eta = calibrate_eta(E, target, ids, seed=0, tol=0.01)
        assert measure_p(E, eta, ids, seed=0) == pytest.approx(target, abs=0.01)
    with pytest.raises(ValueError):
        calibrate_eta(E, 1.0, ids)


def test_privatize_texts(bert):
    tok = bert.tokenizer
    cand = candidate_ids_from_tokenizer(tok, bert.embeddings.shape[0])
    priv = Privatizer(bert.embeddings, 50.0, special_ids=bert.special_ids,
                      candidate_ids=cand, seed=0)
    texts = ["the movie was good", "a very boring plot", "fun"]
    res = privatize_texts_detailed(texts, tok, priv)
    assert len(res.texts) == 3 and [len(r) for r in res.private_ids] == [4, 4, 1]
    assert res.p == replacement_probability(res.original_ids, res.private_ids)
    again = privatize_texts(texts, tok, Privatizer(bert.embeddings, 50.0,
                                                   special_ids=bert.special_ids,
                                                   candidate_ids=cand, seed=0))
    assert again == res.texts
    quiet = privatize_texts_detailed(texts, tok, priv,
                                     token_eta_scale=torch.full((len(tok),), 1e9))
    assert quiet.p == 0.0 and quiet.texts == ["the movie was good", "a very boring plot", "fun"]
    assert privatize_texts([], tok, priv) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_runs_and_reproduces():
    E = _emb(V=500, d=32).cuda()
    ids = torch.randint(0, 500, (4000,), device="cuda")
    a = Privatizer(E, 30.0, seed=1).privatize_ids(ids)
    b = Privatizer(E, 30.0, seed=1).privatize_ids(ids)
    assert a.device.type == "cuda" and torch.equal(a, b)


# --- CLI ---------------------------------------------------------------------------------------

@pytest.fixture()
def tiny_backbone_dir(bert, tmp_path):
    d = tmp_path / "tiny-bert"
    bert.model.save_pretrained(d)
    bert.tokenizer.save_pretrained(d)
    return d


def test_cli_privatize_label_sentence_file(tiny_backbone_dir, tmp_path):
    from typer.testing import CliRunner

    from rapt.cli import app

    src = tmp_path / "in.txt"
    src.write_text("1 the movie was good\n0 a very boring plot\n1 fun fun fun\n")
    dst = tmp_path / "out.txt"
    r = CliRunner().invoke(app, ["privatize", str(src), str(dst), "--protect", "all", "--eta", "20",
                                 "--backbone", str(tiny_backbone_dir), "--seed", "0",
                                 "--format", "label-text", "--json-report"])
    assert r.exit_code == 0, r.output
    lines = dst.read_text().splitlines()
    assert [ln.split(" ", 1)[0] for ln in lines] == ["1", "0", "1"]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert 0.0 <= report["p"] <= 1.0 and report["tokens"] == 11 and report["examples"] == 3


def test_cli_privatize_errors(tiny_backbone_dir, tmp_path):
    from typer.testing import CliRunner

    from rapt.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["privatize", str(tmp_path / "missing.txt"), str(tmp_path / "o"),
                            "--backbone", str(tiny_backbone_dir)])
    assert r.exit_code == 2 and "missing.txt" in r.output
    src = tmp_path / "in.txt"
    src.write_text("1 good\n")
    r = runner.invoke(app, ["privatize", str(src), str(tmp_path / "o"), "--eta", "-1",
                            "--backbone", str(tiny_backbone_dir)])
    assert r.exit_code == 2 and "eta" in r.output


@pytest.mark.parametrize("name,content,fmt,check", [
    ("in.tsv", "sentence\tlabel\nthe movie was good\t1\nbad plot\t0\n", "auto",
     lambda out: out.splitlines()[0] == "sentence\tlabel"
     and [ln.split("\t")[1] for ln in out.splitlines()[1:]] == ["1", "0"]),
    ("in.csv", 'id,text,label\n7,"the movie, was good",1\n8,bad plot,0\n', "auto",
     lambda out: out.splitlines()[0] == "id,text,label"
     and [r[0] for r in __import__("csv").reader(out.splitlines()[1:])] == ["7", "8"]),
    ("in.jsonl", '{"text": "the movie was good", "label": 1, "id": "a"}\n'
     '{"text": "bad plot", "label": 0, "id": "b"}\n', "auto",
     lambda out: [json.loads(x)["id"] for x in out.splitlines()] == ["a", "b"]),
])
def test_cli_privatize_keeps_format(tiny_backbone_dir, tmp_path, name, content, fmt, check):
    from typer.testing import CliRunner

    from rapt.cli import app

    src = tmp_path / name
    src.write_text(content)
    dst = tmp_path / ("out-" + name)
    r = CliRunner().invoke(app, ["privatize", str(src), str(dst), "--protect", "all",
                                 "--eta", "1e6", "--seed", "0",
                                 "--backbone", str(tiny_backbone_dir), "--format", fmt,
                                 "--mode", "fast"])
    assert r.exit_code == 0, r.output
    out = dst.read_text()
    assert check(out), out
    assert "the movie" in out and "P (replaced tokens) = 0.000" in r.output  # η = 1e6: no change


def test_cli_tune_noise_is_unseeded_by_default(tiny_backbone_dir, tmp_path):
    """`rapt tune --eta` privatizes with OS entropy even with the default `--seed 0`: two runs
    differ; `--noise-seed` repeats the run, warns, and the artifact says seeded: true.

    Old behaviour caught: `Privatizer(seed=0)` from the default --seed (identical artifacts);
    calibrating --target-p on the user's rows (the η would change with the file)."""
    from typer.testing import CliRunner

    from rapt.cli import app
    from rapt.tuning.tune import TunedPrompt

    src = tmp_path / "in.csv"
    src.write_text("text,label\n" + "".join(
        f"{t},{y}\n" for t, y in [("the movie was good", 1), ("a very boring plot", 0),
                                  ("fun fun fun", 1), ("bad actors", 0)] * 3))
    runner = CliRunner()

    def tune(out, *extra):
        r = runner.invoke(app, ["tune", str(src), "--out", str(out), "--backbone",
                                str(tiny_backbone_dir), "--eta", "5", "--epochs", "1",
                                "--batch-size", "4", "--max-length", "24", "--plain-len", "3",
                                "--rec-vocab-size", "20", "--num-virtual-tokens", "2",
                                "--privatizer-mode", "exact", *extra])
        assert r.exit_code == 0, r.output
        tuned = TunedPrompt.load(out)
        return r, tuned.meta, tuned.tensors

    _, m1, t1 = tune(tmp_path / "a")
    _, m2, t2 = tune(tmp_path / "b")
    assert m1["seeded"] is False and m1["seed"] == m2["seed"] == 0
    assert any(not torch.equal(t1[k], t2[k]) for k in t1)
    r3, m3, t3 = tune(tmp_path / "c", "--noise-seed", "7")
    _, _, t4 = tune(tmp_path / "d", "--noise-seed", "7")
    assert "warning: --noise-seed" in r3.output and m3["seeded"] is True
    assert all(torch.equal(t3[k], t4[k]) for k in t3)
    # --target-p: η comes from the public sample, so it does not depend on the file.
    etas = []
    for name, body in (("x.csv", src.read_text()),
                       ("y.csv", "text,label\n" + "plot plot plot,0\nmovie movie,1\n" * 4)):
        f = tmp_path / name
        f.write_text(body)
        r = runner.invoke(app, ["tune", str(f), "--out", str(tmp_path / name[0]), "--backbone",
                                str(tiny_backbone_dir), "--target-p", "0.5", "--epochs", "1",
                                "--no-reconstruction", "--num-virtual-tokens", "2",
                                "--privatizer-mode", "exact"])
        assert r.exit_code == 0, r.output
        etas.append(TunedPrompt.load(tmp_path / name[0]).meta["eta"])
    assert etas[0] == etas[1]


def test_calibration_and_privatizer_share_one_index_and_the_eta_is_cached(tiny_bert,
                                                                          monkeypatch):
    """η's calibration and the privatizer after it build the nearest-neighbour index once; a
    second calibration reads η from the cache file, after one measurement confirms it; a
    cached η that no longer gives the target P (an edited file) is calibrated afresh."""
    import json

    import rapt.privacy.mechanism as pr
    from rapt.pipeline import make_privatizer

    builds = []
    real_build = pr.build_index
    monkeypatch.setattr(pr, "build_index", lambda *a, **k: builds.append(1) or real_build(*a,
                                                                                        **k))
    # a target P the tiny vocabulary can hit within the tolerance: one it gives at some η
    sample = pr.public_sample_ids(tiny_bert.tokenizer, tiny_bert.special_ids)
    cand = pr.candidate_ids_from_tokenizer(tiny_bert.tokenizer, tiny_bert.embeddings.shape[0])
    target = next(p for e in (8.0, 32.0, 128.0, 512.0, 2048.0)
                  if 0.2 < (p := pr.measure_p(tiny_bert.embeddings, e, sample,
                                              tiny_bert.special_ids, candidate_ids=cand,
                                              mode="fast")) < 0.8)
    builds.clear()
    pr._SHARED.clear()
    priv = make_privatizer(tiny_bert, None, target, noise_seed=0, mode="fast")
    assert len(builds) == 1 and priv.index is pr._SHARED[0][3]
    eta = priv.eta
    row = tiny_bert.embeddings[7].detach().clone()
    with torch.no_grad():  # a change of the table, even one torch does not count: built anew
        tiny_bert.embeddings.data[7] += 1.0
    pr.Privatizer(tiny_bert.embeddings, eta, special_ids=tiny_bert.special_ids,
                  candidate_ids=priv.candidate_ids, mode="fast")
    assert len(builds) == 2
    with torch.no_grad():
        tiny_bert.embeddings[7].copy_(row)

    def no_bisection(*a, **k):
        raise AssertionError("calibrated again although the cache holds η")

    with monkeypatch.context() as m:
        m.setattr(pr, "calibrate_eta", no_bisection)
        assert pr.calibrate_eta_public(tiny_bert, target) == eta
    path = pr._eta_cache_path()
    doc = json.loads(path.read_text())
    doc = {k: 1e6 for k in doc}  # a wrong η (P ≈ 0 at 1e6): never used
    path.write_text(json.dumps(doc))
    assert pr.calibrate_eta_public(tiny_bert, target) == pytest.approx(eta)
    assert json.loads(path.read_text()) != doc  # the right η is written back
