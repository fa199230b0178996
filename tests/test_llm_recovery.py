"""The LLM reconstruction attacker (rapt.attacks.llm_recovery) on a tiny word vocabulary: the
alignment on hand-made cases, the attacker's plumbing with stub generators whose answers are
known, the prompt never holding a target's original text, and the real generation path on a
tiny random Llama."""

from __future__ import annotations

import random

import pytest
import torch
from _tiny import WORDS

from rapt.attacks import ATTACKERS, ReconstructionInput, run_attackers
from rapt.attacks.llm_recovery import (
    HFGenerator,
    align_guess,
    build_prompt,
    changed_share,
    llm_attack,
)
from rapt.privacy.mechanism import Privatizer, candidate_ids_from_tokenizer

# ------------------------------------------------------------------------------- alignment

@pytest.mark.parametrize(("received", "output", "expected"), [
    ([1, 2, 3], [1, 2, 3], [1, 2, 3]),                 # copied
    ([1, 2, 3], [1, 7, 3], [1, 7, 3]),                 # one substitution
    ([1, 2, 3, 4], [1, 7, 8, 4], [1, 7, 8, 4]),        # a block, same length
    ([1, 2, 3, 4], [1, 7, 8, 9, 4], [1, 7, 8, 4]),     # longer output: pairs the first ones
    ([1, 2, 3, 4], [1, 7, 4], [1, 7, 3, 4]),           # shorter output: the rest kept
    ([1, 2, 3], [1, 9, 2, 3], [1, 2, 3]),              # an insertion has no position
    ([1, 2, 3, 4], [1, 4], [1, 2, 3, 4]),              # deleted positions keep the received
    ([1, 2, 3], [], [1, 2, 3]),                        # empty reply
    ([5, 6, 7, 8], [6, 7, 8, 9], [5, 6, 7, 8]),        # shifted: aligned, not position-wise
])
def test_align_guess(received, output, expected):
    assert align_guess(received, output) == expected


def test_align_guess_keeps_specials_and_copies_that_do_not_round_trip():
    assert align_guess([0, 2, 3], [9, 2, 3], special_ids=[0]) == [0, 2, 3]
    # the reply copied token 5, which the tokenizer writes as 6 7: not a guess
    assert align_guess([1, 5, 3], [1, 6, 7, 3], retokenize=lambda ids: [6, 7] if ids == [5]
                       else ids) == [1, 5, 3]
    assert align_guess([1, 5, 3], [1, 6, 8, 3], retokenize=lambda ids: [6, 7] if ids == [5]
                       else ids) == [1, 6, 3]


# ------------------------------------------------------------------------------- attacker

def _rows(tok, n: int, seed: int, lo: int = 7, hi: int = 12) -> list[list[int]]:
    rng = random.Random(seed)
    ids = tok.convert_tokens_to_ids(WORDS)
    return [[ids[rng.randrange(len(ids))] for _ in range(rng.randint(lo, hi))]
            for _ in range(n)]


@pytest.fixture()
def case(tiny_bert):
    """Originals, a release at a small η (most tokens replaced) and the attacker's input (no
    originals in it)."""
    tok = tiny_bert.tokenizer
    emb = tiny_bert.embeddings.detach()
    cand = candidate_ids_from_tokenizer(tok, emb.shape[0])
    original = _rows(tok, 12, seed=0)
    priv = Privatizer(emb, 8.0, special_ids=tiny_bert.special_ids, candidate_ids=cand, seed=1)
    flat = priv.privatize_ids(torch.tensor([t for r in original for t in r])).cpu()
    private = [x.tolist() for x in torch.split(flat, [len(r) for r in original])]
    inp = ReconstructionInput(private, emb, 8.0, tuple(tiny_bert.special_ids), cand,
                              public_rows=_rows(tok, 40, seed=2), backbone=tiny_bert, seed=3)
    text = {tok.decode(p): tok.decode(o) for p, o in zip(private, original, strict=True)}
    assert len(text) == len(original)  # the stubs look targets up by their privatized text
    return original, inp, text


def _target(prompt: str) -> str:
    return prompt.rsplit("Noisy: ", 1)[1].split("\n", 1)[0]


def test_a_reply_with_the_originals_recovers_everything(case):
    original, inp, text = case
    inp.options.update(llm_generate=lambda prompts, caps: [text[_target(p)] for p in prompts],
                       llm_max_change=1.0)
    r = run_attackers(["nn", "llm"], inp, original)
    assert r["nn"]["replaced"] == 0.0 and r["nn"]["n_replaced"] > 30
    assert r["llm"]["all"] == 1.0 and r["llm"]["replaced"] == 1.0


def test_a_reply_that_changes_too_much_of_a_row_is_dropped(case):
    original, inp, text = case
    share = [changed_share(p, o) for p, o in zip(inp.private_rows, original, strict=True)]
    cut = (min(share) + max(share)) / 2
    assert min(share) < cut < max(share)  # both kinds of row are there
    inp.options.update(llm_generate=lambda prompts, caps: [text[_target(p)] for p in prompts],
                       llm_max_change=cut)
    guess = llm_attack(inp)
    for g, p, o, s in zip(guess, inp.private_rows, original, share, strict=True):
        assert g == (o if s <= cut else p)


def test_a_reply_that_copies_the_release_is_nearest_neighbour(case):
    original, inp, _ = case
    inp.options["llm_generate"] = lambda prompts, caps: [_target(p) for p in prompts]
    assert ATTACKERS["llm"](inp) == inp.private_rows
    r = run_attackers(["nn", "llm"], inp, original)
    assert r["llm"] == r["nn"]


def test_the_prompt_holds_the_release_and_public_examples_never_the_target(case):
    original, inp, _ = case
    tok = inp.backbone.tokenizer
    seen: list[str] = []

    def record(prompts, caps):
        seen.extend(prompts)
        assert all(c >= 1 for c in caps)
        return [""] * len(prompts)

    inp.options.update(llm_generate=record, llm_shots=3)
    assert llm_attack(inp) == inp.private_rows  # empty replies: everything kept
    assert len(seen) == len(original)
    public = [tok.decode(r) for r in inp.public_rows]
    for prompt, o, p in zip(seen, original, inp.private_rows, strict=True):
        assert _target(prompt) == tok.decode(p)
        assert o != p and tok.decode(o) not in prompt
        assert sum(t in prompt for t in public) == 3  # the shots' originals are public rows


def test_max_rows_and_missing_inputs(case):
    original, inp, text = case
    inp.options.update(llm_generate=lambda prompts, caps: [text[_target(p)] for p in prompts],
                       llm_max_rows="5", llm_max_change="1")  # the CLI passes strings
    guess = llm_attack(inp)
    assert guess[:5] == original[:5] and guess[5:] == inp.private_rows[5:]
    inp.public_rows = None
    with pytest.raises(ValueError, match="public_rows"):
        llm_attack(inp)
    inp.backbone = None
    with pytest.raises(ValueError, match="backbone"):
        llm_attack(inp)


def test_the_real_generation_path_on_a_tiny_llama(case, tiny_llama):
    """A random Llama reconstructs nothing; this checks batching, caps and shapes."""
    original, inp, _ = case
    gen = HFGenerator(tiny_llama, batch_size=5, progress=False)
    replies = gen(["the movie", "a good film was", "it"], [3, 1, 2])
    assert [len(gen.tokenizer(r, add_special_tokens=False)["input_ids"]) <= c
            for r, c in zip(replies, [3, 1, 2], strict=True)] == [True] * 3
    inp.options.update(llm_backbone=tiny_llama, llm_shots=2, llm_batch_size=4,
                       llm_progress="false")
    guess = llm_attack(inp)
    assert [len(g) for g in guess] == [len(r) for r in original]
    with pytest.raises(ValueError, match="causal"):
        HFGenerator(inp.backbone)


def test_build_prompt_plain_and_chat():
    plain = build_prompt([("a fim", "a film")], "teh movie")
    assert plain.endswith("Noisy: a fim\nOriginal: a film\n\nNoisy: teh movie\nOriginal:")

    class Chat:
        def apply_chat_template(self, msgs, tokenize, add_generation_prompt):
            return "|".join(f"{m['role']}:{m['content']}" for m in msgs)

    chat = build_prompt([("a fim", "a film")], "teh movie", Chat())
    assert chat.split("|")[1:] == ["user:Noisy: a fim", "assistant:a film", "user:Noisy: teh movie"]


def test_cli_runs_the_llm_attacker_and_all_leaves_it_out(tmp_path, tiny_bert, tiny_llama,
                                                         shared_data):
    import json

    from _tiny import save_backbone
    from typer.testing import CliRunner

    from rapt.cli import app
    from rapt.cli.attack_cmd import _attacker_names

    assert "llm" not in _attacker_names(["all"], {})
    assert "llm" in _attacker_names(["all"], {"llm_backbone": "smollm2-135m"})
    src = tmp_path / "in.txt"
    src.write_text("the movie was very good\na boring plot and a bad actor\n")
    r = CliRunner().invoke(app, [
        "attack", "reconstruct", str(src), "--format", "lines", "--backbone",
        str(save_backbone(tiny_bert, tmp_path / "enc")), "--eta", "20", "-a", "nn", "-a", "llm",
        "--public-for", "sst2", "--max-public-rows", "20", "--noise-seed", "0",
        "--option", f"llm_backbone={save_backbone(tiny_llama, tmp_path / 'llm')}",
        "--option", "llm_shots=2", "--option", "llm_progress=false", "--json-report"])
    assert r.exit_code == 0, r.output
    rep = json.loads([ln for ln in r.output.splitlines() if ln.startswith("{")][-1])
    assert set(rep["attackers"]) == {"nn", "llm"}
    assert rep["attackers"]["llm"]["n_all"] == rep["n_tokens"] == 12
