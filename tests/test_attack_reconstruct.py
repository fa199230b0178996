"""Token recovery, the attacker registry and `rapt attack reconstruct` on a tiny backbone."""

from __future__ import annotations

import json

import pytest
import torch
from _tiny import make_bert, save_backbone
from typer.testing import CliRunner

from rapt.attacks import ATTACKERS, ReconstructionInput, register_attacker, run_attackers
from rapt.attacks.recovery import nearest_neighbour_attack, reconstruct, token_recovery
from rapt.cli import app
from rapt.privacy.mechanism import candidate_ids_from_tokenizer, tokenize_texts

SENTENCES = ["the movie was very good", "a boring plot and a bad actor",
             "this film is not fun but the music is great", "it was the worst scene ever",
             "one long dull story", "really funny and brilliant"] * 4


def test_token_recovery_counts_all_and_replaced_tokens():
    orig = [[0, 5, 6, 7], [8, 9]]
    priv = [[0, 5, 1, 2], [3, 9]]  # replaced: 6, 7, 8
    guess = [[0, 5, 6, 4], [4, 4]]  # right: 5 (kept), 6 (replaced)
    r = token_recovery(orig, priv, guess, special_ids=[0])
    assert r == {"all": pytest.approx(2 / 5), "replaced": pytest.approx(1 / 3), "n_all": 5,
                 "n_replaced": 3}
    assert token_recovery([[0]], [[0]], [[0]], [0]) == {"all": 0.0, "replaced": 0.0,
                                                      "n_all": 0, "n_replaced": 0}
    with pytest.raises(ValueError, match="align"):
        token_recovery(orig, priv, [[0, 5, 6], [4, 4]])


@pytest.fixture(scope="module")
def tiny(tiny_tokenizer):
    return make_bert(tiny_tokenizer, seed=3)


def test_nearest_neighbour_returns_the_release_and_recovers_one_minus_p(tiny):
    rows = tokenize_texts(SENTENCES, tiny.tokenizer)
    res = reconstruct(rows, tiny, 120.0, ["nn"], seed=0, mode="exact")
    r = res["attackers"]["nn"]
    assert 0.2 < res["p"] < 0.9
    assert r["replaced"] == 0.0 and r["n_replaced"] > 0
    assert r["all"] == pytest.approx(1 - res["p"])
    emb = tiny.embeddings.detach()
    priv = [[5, 9, 12], [7]]
    inp = ReconstructionInput(priv, emb, 40.0, tuple(tiny.special_ids),
                              candidate_ids_from_tokenizer(tiny.tokenizer, emb.shape[0]))
    assert nearest_neighbour_attack(inp) == priv


def test_registry_refuses_duplicates_and_unknown_names():
    assert {"nn", "bayes"} <= set(ATTACKERS)
    with pytest.raises(ValueError, match="already registered"):
        register_attacker("nn", lambda inp: inp.private_rows)
    inp = ReconstructionInput([[1]], torch.zeros(3, 2), 1.0)
    with pytest.raises(ValueError, match="unknown attacker"):
        run_attackers(["nope"], inp, [[1]])


def _cli(args: list[str]):
    return CliRunner().invoke(app, ["attack", "reconstruct", *args])


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny):
    tmp = tmp_path_factory.mktemp("reconstruct")
    src = tmp / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n")
    return save_backbone(tiny, tmp / "bb"), src


def test_cli_runs_a_registered_attacker(setup):
    folder, src = setup
    seen: list[ReconstructionInput] = []

    def guess_the(inp: ReconstructionInput) -> list[list[int]]:
        seen.append(inp)
        the = int(inp.backbone.tokenizer.convert_tokens_to_ids("the"))
        return [[the] * len(r) for r in inp.private_rows]

    register_attacker("test-the", guess_the)
    try:
        r = _cli([str(src), "--format", "lines", "--backbone", str(folder), "--eta", "120",
                  "-a", "nn", "-a", "test-the", "--option", "x=1", "--noise-seed", "0",
                  "--json-report"])
    finally:
        del ATTACKERS["test-the"]
    assert r.exit_code == 0, r.output
    rep = json.loads([ln for ln in r.output.splitlines() if ln.startswith("{")][-1])
    assert list(rep["attackers"]) == ["nn", "test-the"]
    assert rep["attackers"]["nn"]["replaced"] == 0.0
    assert rep["attackers"]["nn"]["all"] == pytest.approx(1 - rep["p"])
    assert 0 < rep["attackers"]["test-the"]["all"] < 0.3  # "the" is a few of the tokens
    assert seen[0].options["x"] == "1" and seen[0].public_rows is None
    assert "recovery" in r.output and rep["public_corpus"] is None


def test_cli_bayes_with_a_public_corpus(setup, shared_data):
    folder, src = setup
    r = _cli([str(src), "--format", "lines", "--backbone", str(folder), "--eta", "120",
              "-a", "all", "--public-for", "sst2", "--max-public-rows", "30",
              "--bayes-k", "20", "--bayes-samples", "50", "--noise-seed", "0", "--json-report"])
    assert r.exit_code == 0, r.output
    rep = json.loads([ln for ln in r.output.splitlines() if ln.startswith("{")][-1])
    assert {"nn", "bayes"} <= set(rep["attackers"])
    assert rep["public_corpus"]["disjoint_from"] == "sst2"
    assert rep["public_corpus"]["n_tokens"] > 0 and rep["options"]["bayes_k"] == 20


def test_cli_bigram_bayes_with_a_public_corpus(setup, shared_data):
    folder, src = setup
    r = _cli([str(src), "--format", "lines", "--backbone", str(folder), "--eta", "120",
              "-a", "nn", "-a", "bayes-bigram", "--public-for", "sst2",
              "--max-public-rows", "30", "--bayes-k", "20", "--option", "bigram_samples=64",
              "--noise-seed", "0", "--json-report"])
    assert r.exit_code == 0, r.output
    rep = json.loads([ln for ln in r.output.splitlines() if ln.startswith("{")][-1])
    assert set(rep["attackers"]) == {"nn", "bayes-bigram"}
    assert rep["attackers"]["bayes-bigram"]["n_all"] == rep["attackers"]["nn"]["n_all"] > 0


def test_cli_errors(setup):
    folder, src = setup
    base = [str(src), "--format", "lines", "--backbone", str(folder)]
    r = _cli(base)
    assert r.exit_code == 2 and "--eta or --target-p" in r.output
    r = _cli([*base, "--eta", "120", "-a", "nope"])
    assert r.exit_code == 2 and "unknown --attacker" in r.output
    r = _cli([*base, "--eta", "120", "-a", "bayes"])
    assert r.exit_code == 2 and "--public-for" in r.output
    r = _cli([*base, "--eta", "120", "-a", "bayes-bigram"])
    assert r.exit_code == 2 and "--public-for" in r.output


def test_all_leaves_out_attackers_that_would_train_unless_their_model_is_given():
    """`--attacker all` must not start minutes of denoiser training on its own."""
    from rapt.cli.attack_cmd import _attacker_names

    plain = _attacker_names(["all"], {})
    assert "nn" in plain and "bayes" in plain and "denoiser" not in plain
    assert "bayes-bigram" not in plain  # 1024 draws of each of 2000 candidates
    assert "bayes-bigram" in _attacker_names(["all"], {"bigram_samples": "256"})
    assert "denoiser" in _attacker_names(["all"], {"denoiser": "/some/folder"})
    assert _attacker_names(["denoiser"], {}) == ["denoiser"]
