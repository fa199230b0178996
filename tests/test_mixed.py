"""Mixed passes (rapt.service.mixed) equal the per-prompt reference path: random mixes of soft
prompts, prefixes of different lengths and LoRA adapters of different ranks over the tiny BERT
and Llama backbones, with padded rows of different lengths, plain tokens and several heads."""

from __future__ import annotations

import pytest
import torch
from _tiny import random_prompt

from rapt.service import mixed
from rapt.service.inference import default_forward, per_prompt_forward
from rapt.tuning.tuners import base_model

ATOL = 1e-5


def _prompts(bb, family: str) -> list:
    """Five prompts of one family on ``bb``: lengths / ranks differ, one reads past plain
    tokens, heads vary (linear, label descriptions on BERT, a verbalizer on Llama)."""
    sizes = {"prompt": (4, 4, 2, 4, 2), "prefix": (1, 3, 7, 2, 5), "lora": (1, 2, 8, 4, 3)}
    out = []
    for k, size in enumerate(sizes[family]):
        C = 2 + k % 2
        cfg: dict = {"method": family}
        if family == "lora":
            cfg["lora_r"] = size
        else:
            cfg["num_virtual_tokens"] = size
        if family == "prefix" and k == 3:
            cfg["prefix_projection"] = True
        if k == 1:
            if bb.kind == "causal":
                cfg |= {"head": "verbalizer", "label_words": ["good", "bad", "fun"][:C]}
            else:
                cfg |= {"head": "label-description",
                        "label_descriptions": ["a bad film", "a good film", "a long film"][:C]}
        plain = {"plain_len": 3, "plain_offset": 1} if k == 2 else {}
        out.append(random_prompt(bb, seed=10 * k + 1, num_labels=C, **plain, **cfg))
    return out


def _rows(g: torch.Generator, n: int, V: int) -> list[list[int]]:
    """``n`` rows of 5..14 tokens ([CLS] ... [SEP]); padded within a pass."""
    return [[2] + torch.randint(5, V, (int(torch.randint(3, 13, (1,), generator=g)),),
                                generator=g).tolist() + [3] for _ in range(n)]


def _random_items(prompts: list, g: torch.Generator, V: int, n_items: int = 7) -> list:
    """Items over random prompts (some twice), 1..4 rows each."""
    return [(prompts[int(torch.randint(len(prompts), (1,), generator=g))],
             _rows(g, int(torch.randint(1, 5, (1,), generator=g)), V)) for _ in range(n_items)]


def _count_passes(bb):
    passes: list[int] = []
    hook = base_model(bb.model).register_forward_hook(lambda *a: passes.append(1))
    return passes, hook


def _close(got, ref) -> None:
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=ATOL, rtol=0), (a - b).abs().max()


@pytest.mark.parametrize("family", ["prompt", "prefix", "lora"])
@pytest.mark.parametrize("bb_name", ["tiny_bert", "tiny_llama"])
def test_random_mixes_match_the_per_prompt_path(bb_name, family, request):
    bb = request.getfixturevalue(bb_name)
    prompts = _prompts(bb, family)
    V = bb.embeddings.shape[0]
    g = torch.Generator().manual_seed(len(family))
    for _ in range(3):
        items = _random_items(prompts, g, V)
        ref = per_prompt_forward(bb, items)
        _close(mixed.forward(bb, items), ref)
        passes, hook = _count_passes(bb)
        try:
            got = mixed.forward(bb, items, max_padding=float("inf"))
        finally:
            hook.remove()
        _close(got, ref)
        # every distinct family in one pass: prompt lengths 4 and 2 are two families
        assert len(passes) == len({mixed.mixable(bb, p).family for p, _ in items})


@pytest.mark.parametrize("bb_name", ["tiny_bert", "tiny_llama"])
def test_lora_updates_matter_at_the_tested_tolerance(bb_name, request):
    """Guards the equality above: without its adapter a LoRA prompt predicts differently by
    far more than 1e-5, so a mixed pass that dropped the updates could not pass."""
    from rapt.tuning.tune import TunedPrompt

    bb = request.getfixturevalue(bb_name)
    p = _prompts(bb, "lora")[2]
    zero = TunedPrompt(p.config, {k: v * 0 if ".lora_" in k else v
                                  for k, v in p.tensors.items()}, p.meta)
    rows = _rows(torch.Generator().manual_seed(0), 6, bb.embeddings.shape[0])
    a, b = mixed.forward(bb, [(p, rows), (zero, rows)])
    assert (a - b).abs().max() > 1e-3


def test_default_forward_mixes_families_and_runs_the_rest_per_prompt(tiny_llama):
    """One batch of every method: prompt, prefix and LoRA rows go through one pass per family,
    full fine-tuning one pass per prompt; all equal to the per-prompt path."""
    bb = tiny_llama
    prompts = [*_prompts(bb, "prompt")[:2], *_prompts(bb, "prefix")[:3],
               *_prompts(bb, "lora")[:3], random_prompt(bb, 5, method="full", scale=0.01)]
    assert mixed.mixable(bb, prompts[-1]) is None
    g = torch.Generator().manual_seed(3)
    items = [(p, _rows(g, 2, bb.embeddings.shape[0])) for p in prompts]
    ref = per_prompt_forward(bb, items)
    passes, hook = _count_passes(bb)
    try:
        got = default_forward(bb, items)
    finally:
        hook.remove()
    _close(got, ref)
    # fewer shared-body passes than mixable prompts (rows are cut into passes by padding cost;
    # the full model runs its private copy)
    assert 3 <= len(passes) < len(prompts) - 1
    with pytest.raises(ValueError, match="cannot share a mixed pass"):
        mixed.forward(bb, items)


def test_a_prefix_pass_keeps_real_positions_whatever_the_padding(tiny_llama):
    """A short prefix next to a long one is left-padded and masked: the row gives exactly
    what it gives alone (rotary positions of the real tokens unchanged)."""
    bb = tiny_llama
    short, long_ = (random_prompt(bb, s, method="prefix", num_virtual_tokens=n)
                    for s, n in ((1, 1), (2, 9)))
    rows = _rows(torch.Generator().manual_seed(1), 3, bb.embeddings.shape[0])
    alone = mixed.forward(bb, [(short, rows)])[0]
    together = mixed.forward(bb, [(long_, rows[:1]), (short, rows)],
                             max_padding=float("inf"))[1]
    _close([together], [alone])
    _close([alone], [short.predict_proba(bb, rows)])


def test_mixed_lora_builds_no_copy_of_the_backbone(tiny_bert):
    """The mixed path reads the adapters from the saved tensors: no per-prompt model (and so
    no private copy of the backbone) is built."""
    p = _prompts(tiny_bert, "lora")[0]
    rows = _rows(torch.Generator().manual_seed(2), 2, tiny_bert.embeddings.shape[0])
    mixed.forward(tiny_bert, [(p, rows)])
    assert p._cache is None


@pytest.mark.parametrize("bb_name", ["tiny_bert", "tiny_llama"])
def test_eager_attention_masks_padded_prefix_slots_too(bb_name, request):
    """The fixtures use SDPA; the eager path adds the same mask to the scores."""
    bb = request.getfixturevalue(bb_name)
    bb.model.set_attn_implementation("eager")
    assert base_model(bb.model).config._attn_implementation == "eager"
    prompts = _prompts(bb, "prefix")
    items = _random_items(prompts, torch.Generator().manual_seed(5), bb.embeddings.shape[0])
    _close(mixed.forward(bb, items, max_padding=float("inf")), per_prompt_forward(bb, items))
