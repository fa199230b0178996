"""The fine-tuned LLM attacker (rapt.attacks.llm_tuning) on a toy grammar with a tiny random
Llama built in code: the "privatization" is a fixed word substitution, which the LoRA-tuned
LLM learns and the untuned one cannot guess; the loss reads the answer only; the adapter saves,
loads and drives the "llm" attacker; seeded runs repeat."""

from __future__ import annotations

import json
import random

import pytest
import torch
from _tiny import SPECIALS

from rapt.artifacts import ArtifactError
from rapt.attacks import ReconstructionInput, run_attackers
from rapt.attacks.llm_prompt import build_prompt
from rapt.attacks.llm_recovery import llm_attack
from rapt.attacks.llm_tuning import (
    AnswerCE,
    LLMTuningConfig,
    TunedLLM,
    encode_pairs,
    train_llm_attacker,
)
from rapt.training.loop import ModelOutput

SLOTS = (("the", "a", "this"), ("good", "bad", "great", "dull", "fun"),
         ("movie", "film", "plot", "story"), ("is", "was"), ("fine", "long", "weak", "nice"))
SUB = {"good": "nice", "movie": "music", "was": "it"}  # the toy channel: fixed, learnable
WORDS = sorted({w for slot in SLOTS for w in slot} | set(SUB.values())
               | {"noisy", "original", ":", ".", "with", "in"})


def _toy_llm(hidden: int = 64, seed: int = 0):
    """A random 2-layer Llama whose word tokenizer knows the grammar and the prompt's marks
    ([SEP] is its EOS)."""
    from transformers import BertTokenizerFast, LlamaConfig, LlamaForCausalLM

    from rapt.models import from_model

    vocab = {t: i for i, t in enumerate([*SPECIALS, *WORDS])}
    tok = BertTokenizerFast(vocab=vocab, do_lower_case=True, eos_token="[SEP]")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=2 * hidden,
                      max_position_embeddings=128, pad_token_id=tok.pad_token_id,
                      initializer_range=0.1)  # weights large enough for LoRA to steer quickly
    return from_model(LlamaForCausalLM(cfg).eval(), tok, name="toy-llama", kind="causal")


def _sentences(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(slot) for slot in SLOTS] for _ in range(n)]


def _privatize(words: list[str]) -> list[str]:
    return [SUB.get(w, w) for w in words]


def _pairs(n: int, seed: int) -> list[tuple[str, str]]:
    return [(" ".join(_privatize(s)), " ".join(s)) for s in _sentences(n, seed)]


def _input(llm, sentences, **options) -> tuple[list[list[int]], ReconstructionInput]:
    """(original ids, the attacker's input: the toy release, read with the LLM's own
    tokenizer as the encoder's)."""
    tok = llm.tokenizer
    orig = [tok.convert_tokens_to_ids(s) for s in sentences]
    private = [tok.convert_tokens_to_ids(_privatize(s)) for s in sentences]
    inp = ReconstructionInput(private, torch.randn(len(tok), 8), 1.0, tuple(llm.special_ids),
                              list(range(len(SPECIALS), len(tok))), public_rows=None,
                              backbone=llm, seed=0,
                              options={"llm_progress": False, "llm_max_change": 1.0, **options})
    return orig, inp


SMALL = LLMTuningConfig(lr=5e-3, epochs=1, batch_size=8, lora_r=4, max_tokens=96)


@pytest.fixture(scope="module")
def toy():
    """The toy LLM and one adapter trained on 600 public pairs (4 epochs)."""
    llm = _toy_llm()
    cfg = LLMTuningConfig(lr=5e-3, epochs=4, batch_size=16, lora_r=8, max_tokens=96,
                          warmup=0.05)
    hist: list[dict] = []
    tuned = train_llm_attacker(llm, _pairs(600, seed=0), cfg,
                               meta={"eta": 1.0, "corpus": "toy grammar"}, progress=hist.append)
    return llm, tuned, hist


# ------------------------------------------------------------------------------- learning

def test_the_tuned_attacker_recovers_replaced_tokens_the_untuned_one_does_not(toy):
    llm, tuned, hist = toy
    assert hist[-1]["answer_acc"] > hist[0]["answer_acc"]
    assert sum(h["loss"] for h in hist[-10:]) < sum(h["loss"] for h in hist[:10])
    sentences = _sentences(40, seed=1)  # unseen draws of the grammar
    orig, inp = _input(llm, sentences, llm_backbone=llm, llm_shots=0)
    untuned = run_attackers(["nn", "llm"], inp, orig)
    orig, inp = _input(llm, sentences, llm_adapter=tuned)
    after = run_attackers(["llm"], inp, orig)["llm"]
    assert untuned["nn"]["replaced"] == 0.0 and untuned["nn"]["n_replaced"] >= 30
    assert untuned["llm"]["replaced"] <= 0.1
    assert after["replaced"] >= 0.8, after
    assert after["all"] >= untuned["nn"]["all"] + 0.1 > untuned["llm"]["all"] + 0.1
    # the caller's LLM is left as it was: the adapter lives on a private copy
    assert not any("lora_" in n for n, _ in llm.model.named_parameters())


# ------------------------------------------------------------------------------- loss masking

def test_only_the_answer_and_eos_are_labelled():
    llm = _toy_llm(hidden=32)
    tok = llm.tokenizer
    pairs = _pairs(5, seed=2)
    enc = encode_pairs(tok, pairs, max_tokens=96)
    for i, (noisy, clean) in enumerate(pairs):
        prompt = tok(build_prompt([], noisy), add_special_tokens=False)["input_ids"]
        answer = [*tok(f" {clean}", add_special_tokens=False)["input_ids"], tok.eos_token_id]
        n = len(prompt) + len(answer)
        assert enc.ids[i, :n].tolist() == prompt + answer
        assert enc.labels[i, :len(prompt)].eq(-100).all()  # the prompt is never a target
        assert enc.labels[i, len(prompt):n].tolist() == answer
        assert enc.labels[i, n:].eq(-100).all() and enc.mask[i, n:].eq(0).all()
    assert enc.answer_tokens == int((enc.labels != -100).sum())


def test_the_loss_does_not_move_with_the_prompts_predictions():
    """Logits that would predict prompt tokens are free; logits of the answer are not."""
    llm = _toy_llm(hidden=32)
    enc = encode_pairs(llm.tokenizer, _pairs(3, seed=3), max_tokens=96)
    ce = AnswerCE(enc.labels)
    idx = torch.arange(3)
    logits = torch.randn(3, enc.ids.shape[1], len(llm.tokenizer), generator=torch.Generator()
                         .manual_seed(0))
    base, stats = ce(ModelOutput(logits, None, logits), idx)
    # position t predicts token t + 1: the answer's predictors sit one before each label
    predicts_answer = torch.zeros_like(enc.labels, dtype=torch.bool)
    predicts_answer[:, :-1] = enc.labels[:, 1:] != -100
    noisy = logits + 5 * torch.randn_like(logits) * (~predicts_answer).unsqueeze(-1)
    same, _ = ce(ModelOutput(noisy, None, noisy), idx)
    assert torch.allclose(base, same)
    moved = logits + 5 * torch.randn_like(logits) * predicts_answer.unsqueeze(-1)
    other, _ = ce(ModelOutput(moved, None, moved), idx)
    assert not torch.allclose(base, other)
    assert stats["answer_acc"].numel() == int((enc.labels != -100).sum())


def test_pairs_too_long_are_left_out_and_a_tokenizer_needs_eos():
    llm = _toy_llm(hidden=32)
    pairs = _pairs(4, seed=4)
    full = encode_pairs(llm.tokenizer, pairs, max_tokens=96)
    width = int(full.mask.sum(1).max())
    assert encode_pairs(llm.tokenizer, pairs, max_tokens=width).dropped == 0
    with pytest.raises(ValueError, match="max_tokens"):
        encode_pairs(llm.tokenizer, pairs, max_tokens=10)
    llm.tokenizer.eos_token = None
    with pytest.raises(ValueError, match="EOS"):
        encode_pairs(llm.tokenizer, pairs, max_tokens=96)


# ------------------------------------------------------------------------------- artifact

def test_save_load_round_trip_keeps_weights_provenance_and_guesses(toy, tmp_path):
    llm, tuned, _ = toy
    tuned.config.max_change = 0.5
    folder = tuned.save(tmp_path / "adapter")
    doc = json.loads((folder / "config.json").read_text())
    assert doc["format"] == "rapt-llm-attacker" and doc["config"]["max_change"] == 0.5
    meta = doc["meta"]
    assert (meta["base"], meta["eta"], meta["corpus"]) == ("toy-llama", 1.0, "toy grammar")
    assert meta["steps"] == 4 * -(-600 // 16) and meta["pairs"] == 600
    back = TunedLLM.load(folder, llm)
    a, b = tuned.trained_tensors(), back.trained_tensors()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert back.config == tuned.config and back.meta["base"] == "toy-llama"
    sentences = _sentences(12, seed=5)
    _, inp = _input(llm, sentences, llm_adapter=tuned)
    _, by_folder = _input(llm, sentences, llm_adapter=str(folder), llm_backbone=llm)
    assert llm_attack(inp) == llm_attack(by_folder)
    with pytest.raises(ArtifactError, match="hidden size"):
        TunedLLM.load(folder, _toy_llm(hidden=32))


def test_the_adapter_sets_shots_and_filter_and_refuses_the_chat_template(toy):
    llm, tuned, _ = toy
    seen: list[str] = []

    def record(prompts, caps):
        seen.extend(prompts)
        return [""] * len(prompts)

    _, inp = _input(llm, _sentences(3, seed=6), llm_adapter=tuned, llm_generate=record)
    llm_attack(inp)  # no public rows needed: no examples
    assert seen and all(p.count("Noisy:") == 1 for p in seen)
    tuned.config.max_change = 0.0
    _, inp = _input(llm, _sentences(8, seed=7), llm_adapter=tuned)
    del inp.options["llm_max_change"]  # the adapter's own cap: no change at all allowed
    assert llm_attack(inp) == inp.private_rows
    inp.options["llm_chat"] = True
    with pytest.raises(ValueError, match="chat"):
        llm_attack(inp)


def test_seeded_runs_repeat_and_the_seed_matters():
    llm = _toy_llm(hidden=32)
    pairs = _pairs(40, seed=8)

    def run(seed: int) -> dict[str, torch.Tensor]:
        cfg = LLMTuningConfig(**{**SMALL.__dict__, "seed": seed})
        return train_llm_attacker(llm, pairs, cfg).trained_tensors()

    a, b, c = run(0), run(0), run(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_config_is_checked():
    with pytest.raises(ValueError, match="lora_r"):
        LLMTuningConfig(lora_r=0)
    with pytest.raises(ValueError, match="max_change"):
        LLMTuningConfig(max_change=1.5)

def test_an_encoder_is_refused(tiny_bert):
    with pytest.raises(ValueError, match="causal"):
        TunedLLM(tiny_bert, SMALL)


def test_the_cli_attacks_with_a_saved_adapter(tmp_path, tiny_bert, shared_data):
    from _tiny import save_backbone
    from typer.testing import CliRunner

    from rapt.cli import app
    from rapt.cli.attack_cmd import _attacker_names

    assert "llm" in _attacker_names(["all"], {"llm_adapter": "FOLDER"})
    llm = _toy_llm(hidden=32)
    adapter = train_llm_attacker(llm, _pairs(16, seed=9), SMALL).save(tmp_path / "adapter")
    src = tmp_path / "in.txt"
    src.write_text("the movie was very good\na boring plot and a bad actor\n")
    r = CliRunner().invoke(app, [
        "attack", "reconstruct", str(src), "--format", "lines", "--backbone",
        str(save_backbone(tiny_bert, tmp_path / "enc")), "--eta", "20", "-a", "nn", "-a", "llm",
        "--public-for", "sst2", "--max-public-rows", "20", "--noise-seed", "0",
        "--option", f"llm_backbone={save_backbone(llm, tmp_path / 'llm')}",
        "--option", f"llm_adapter={adapter}", "--option", "llm_progress=false",
        "--json-report"])
    assert r.exit_code == 0, r.output
    rep = json.loads([ln for ln in r.output.splitlines() if ln.startswith("{")][-1])
    assert set(rep["attackers"]) == {"nn", "llm"}
    assert rep["attackers"]["llm"]["n_all"] == rep["n_tokens"] == 12
