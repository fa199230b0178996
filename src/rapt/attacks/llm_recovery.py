"""LLM reconstruction attacker: a causal LLM rewrites each privatized row, few-shot or tuned.

After "The Double-edged Sword of LLM-based Data Reconstruction" (arXiv 2508.18976): the attacker
decodes a privatized row of the *encoder's* tokenizer to text and asks a causal LLM (default
SmolLM2-135M-Instruct) for the original sentence. The prompt's examples are *public* sentences
privatized at the same η by the provider's own :class:`rapt.privacy.mechanism.Privatizer`, paired
with their originals; then comes the target's privatized text. The reply is tokenized with the
encoder's tokenizer and aligned to the privatized row (:func:`align_guess`), so that
:func:`rapt.attacks.recovery.token_recovery` scores it position by position. The LLM sees only
the release and public text, never a target's original ids.

Registry entry ``"llm"``; options (``ReconstructionInput.options``):

* ``llm_backbone``: a name or path for :func:`rapt.models.load_backbone`, or a loaded causal
  :class:`~rapt.models.Backbone` (default ``smollm2-135m``);
* ``llm_adapter``: a LoRA adapter fine-tuned for this attack (:mod:`rapt.attacks.llm_tuning`):
  the folder of a saved one (loaded on ``llm_backbone``, or on the base LLM its provenance
  names when that option is not given) or a loaded :class:`~rapt.attacks.llm_tuning.TunedLLM`;
  it was trained on the zero-shot plain prompt, so the shots default to 0 and ``llm_chat`` is
  refused;
* ``llm_shots``: examples in the prompt (4; 0 with an adapter);
* ``llm_max_rows``: attack the first N rows only; the rest are returned as received (nearest
  neighbour's guess);
* ``llm_max_change``: drop a reply that changes more than this share of a row's tokens
  (the adapter's own ``max_change`` when it has one, else :data:`DEFAULT_MAX_CHANGE`);
* ``llm_chat``: frame the prompt with the LLM's chat template (off: on held-out public text
  SmolLM2-135M recovered less with it);
* ``llm_batch_size`` (8), ``llm_progress`` (tqdm bar, on);
* ``llm_generate``: a :data:`Generator` that replaces the LLM (e.g. a stub in tests).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from rapt.attacks.llm_prompt import build_prompt
from rapt.attacks.recovery import ReconstructionInput, register_attacker

if TYPE_CHECKING:
    from rapt.attacks.llm_tuning import TunedLLM
    from rapt.models import Backbone

__all__ = ["DEFAULT_LLM", "DEFAULT_MAX_CHANGE", "Generator", "HFGenerator", "align_guess",
           "build_prompt", "changed_share", "few_shot_examples", "llm_attack"]

DEFAULT_LLM = "smollm2-135m"
DEFAULT_SHOTS = 4
SHOT_LENGTHS = (6, 24)  # encoder tokens per example: long enough to show context, short prompts
NEW_TOKENS_FACTOR = 1.5  # reply budget, × the target's length in LLM tokens
# A reply that changes more of a row than this is dropped (the row is kept as received): the
# mechanism leaves most tokens alone at any useful η, and a small LLM that loses the thread
# rewrites or repeats itself over the rest. The value SmolLM2-135M scored best with (P ≈ 0.4,
# MiniLM) on held-out public rows in benchmarks/bench_llm_attack.py; re-pick it for another LLM.
# A fine-tuned adapter carries its own, picked the same way (LLMTuningConfig.max_change).
DEFAULT_MAX_CHANGE = 0.1

# (prompts, max new tokens per prompt) -> one reply per prompt
Generator = Callable[[Sequence[str], Sequence[int]], list[str]]


def _edit_path(a: Sequence[int], b: Sequence[int]) -> list[tuple[int | None, int | None]]:
    """A minimum edit-distance alignment of ``a`` and ``b`` (substitution, insertion and
    deletion each cost 1): (i, j) pairs, (i, None) for a deleted ``a[i]``, (None, j) for an
    inserted ``b[j]``, in order. Ties go to substitution, earliest first (a longer reply pairs
    its first tokens), so equal-length rows pair position by position unless a shift saves
    edits."""
    # the back-trace walks from the end and takes a substitution first: run it on the reversed
    # rows, so that it is the first tokens of a block that pair up
    a, b = list(a)[::-1], list(b)[::-1]
    n, m = len(a), len(b)
    d = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        d[i][0] = i
    for j in range(m + 1):
        d[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i][j] = min(d[i - 1][j - 1] + (a[i - 1] != b[j - 1]), d[i - 1][j] + 1,
                          d[i][j - 1] + 1)
    path: list[tuple[int | None, int | None]] = []
    i, j = n, m
    while i or j:
        if i and j and d[i][j] == d[i - 1][j - 1] + (a[i - 1] != b[j - 1]):
            i, j = i - 1, j - 1
            path.append((n - 1 - i, m - 1 - j))
        elif i and d[i][j] == d[i - 1][j] + 1:
            i -= 1
            path.append((n - 1 - i, None))
        else:
            j -= 1
            path.append((None, m - 1 - j))
    return path


def align_guess(received: Sequence[int], output: Sequence[int], *,
                special_ids: Sequence[int] = (),
                retokenize: Callable[[list[int]], list[int]] | None = None) -> list[int]:
    """Guessed original ids for one privatized row from the LLM's reply, position by position.

    ``received``: the privatized row; ``output``: the reply's ids in the same tokenizer. The two
    are aligned by minimum edit distance (:func:`_edit_path`; difflib's longest-matching-block
    heuristic pairs a noisy row's repeated function words across positions): a received token
    paired with a different output token takes it. Positions with no paired output (deleted),
    special ids, and changed blocks (runs between matches) whose output is just
    ``retokenize(received block)`` (the reply copied text that does not round-trip through the
    tokenizer) keep the received token. Returns a list of ``len(received)`` ids."""
    rec = [int(t) for t in received]
    out = [int(t) for t in output]
    guess = list(rec)
    special = {int(i) for i in special_ids}
    block: list[tuple[int | None, int | None]] = []
    for step in [*_edit_path(rec, out), (None, None)]:  # the sentinel closes the last block
        i, j = step
        if step != (None, None) and (i is None or j is None or rec[i] != out[j]):
            block.append(step)
            continue
        pairs = [(a, b) for a, b in block if a is not None and b is not None]
        copied = retokenize is not None and retokenize(
            [rec[a] for a, _ in block if a is not None]) == [out[b] for _, b in block
                                                              if b is not None]
        for a, b in pairs:
            if not copied and rec[a] not in special:
                guess[a] = out[b]
        block = []
    return guess


def few_shot_examples(inp: ReconstructionInput, decode: Callable[[list[int]], str],
                      n: int) -> list[tuple[str, str]]:
    """``n`` (privatized, original) text pairs from ``inp.public_rows``, privatized at ``inp.eta``
    with the mechanism's own embeddings and candidates (seeded by ``inp.seed``): rows of
    :data:`SHOT_LENGTHS` tokens where there are enough, preferring ones with a replacement."""
    from rapt.privacy.mechanism import Privatizer

    if n <= 0:
        return []
    if not inp.public_rows:
        raise ValueError("the LLM attacker needs public_rows (public text for its few-shot "
                         "examples)")
    lo, hi = SHOT_LENGTHS
    rows = [list(r) for r in inp.public_rows if lo <= len(r) <= hi]
    rows = rows if len(rows) >= n else [list(r) for r in inp.public_rows if len(r)]
    rng = random.Random(inp.seed)
    pool = rng.sample(rows, min(len(rows), 4 * n))
    priv = Privatizer(inp.embeddings, inp.eta, special_ids=inp.special_ids,
                      candidate_ids=inp.candidate_ids, index=inp.index, seed=inp.seed)
    flat = priv.privatize_ids(torch.tensor([t for r in pool for t in r], dtype=torch.long)).cpu()
    noised = [x.tolist() for x in torch.split(flat, [len(r) for r in pool])]
    # an example where nothing changed teaches copying only: take changed ones first
    order = sorted(range(len(pool)), key=lambda i: noised[i] == pool[i])[:n]
    return [(decode(noised[i]), decode(pool[i])) for i in order]


class HFGenerator:
    """Greedy decoding with a Hugging Face causal LM, in batches of similar length; a reply
    stops at EOS or at the end of its first line."""

    def __init__(self, backbone: Backbone, batch_size: int = 8, progress: bool = True) -> None:
        if backbone.kind != "causal":
            raise ValueError(f"the LLM attacker needs a causal LM, {backbone.name!r} is "
                             f"{backbone.kind}")
        self.model, self.tokenizer = backbone.model, backbone.tokenizer
        self.batch_size, self.progress = int(batch_size), bool(progress)
        nl = self.tokenizer("\n", add_special_tokens=False)["input_ids"]
        eos = self.tokenizer.eos_token_id
        stop = {*([] if eos is None else [int(eos)]), *(nl if len(nl) == 1 else [])}
        self.stop_ids = sorted(stop) or None  # None: run to the cap

    def n_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False,
                                  split_special_tokens=False)["input_ids"])

    @torch.inference_mode()
    def __call__(self, prompts: Sequence[str], max_new_tokens: Sequence[int]) -> list[str]:
        from rapt.progress import progress_bar

        # a chat prompt's markers (<|im_start|>) are the template's, not text: parse them
        enc = [self.tokenizer(p, add_special_tokens=False, split_special_tokens=False)
               ["input_ids"] for p in prompts]
        out: list[str] = [""] * len(enc)
        dev = next(self.model.parameters()).device
        pad = int(self.tokenizer.pad_token_id)
        order = sorted(range(len(enc)), key=lambda i: len(enc[i]))
        bar = progress_bar(total=len(enc), desc="llm attack", unit="row",
                           disable=not self.progress)
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            width = max(len(enc[i]) for i in idx)
            # left padding: every prompt ends where generation starts
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for b, i in enumerate(idx):
                ids[b, width - len(enc[i]):] = torch.tensor(enc[i])
                mask[b, width - len(enc[i]):] = 1
            cap = [max(1, int(max_new_tokens[i])) for i in idx]
            gen = self.model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                                      max_new_tokens=max(cap), do_sample=False,
                                      eos_token_id=self.stop_ids, pad_token_id=pad)
            for b, i in enumerate(idx):
                out[i] = self.tokenizer.decode(gen[b, width:width + cap[b]],
                                               skip_special_tokens=True)
            bar.update(len(idx))
        bar.close()
        return out


def _adapter(opts: dict) -> TunedLLM | None:
    """The ``llm_adapter`` option, loaded (on ``llm_backbone`` when that option is given)."""
    from rapt.attacks.llm_tuning import TunedLLM

    adapter = opts.get("llm_adapter")
    if adapter is None:
        return None
    if _flag(opts.get("llm_chat", False)):
        raise ValueError("an llm_adapter was trained on the plain prompt, not the chat "
                         "template: drop llm_chat")
    return adapter if isinstance(adapter, TunedLLM) else TunedLLM.load(
        adapter, opts.get("llm_backbone"))


def _generator(inp: ReconstructionInput, adapter: TunedLLM | None = None,
               ) -> tuple[Generator, Callable[[str], int], Any]:
    """(generate, LLM token count of a text, the tokenizer whose chat template frames the
    prompt or None) from the options; ``adapter``: generate with its tuned LLM."""
    opts = inp.options
    stub = opts.get("llm_generate")
    if stub is not None:
        return stub, lambda text: len(text.split()), None
    llm: Any = opts.get("llm_backbone", DEFAULT_LLM) if adapter is None else adapter.backbone
    if isinstance(llm, str):
        from rapt.models import load_backbone

        llm = load_backbone(llm, kind="causal")
    gen = HFGenerator(llm, int(opts.get("llm_batch_size", 8)),
                      _flag(opts.get("llm_progress", True)))
    chat = _flag(opts.get("llm_chat", False)) and getattr(llm.tokenizer, "chat_template", None)
    return gen, gen.n_tokens, llm.tokenizer if chat else None


def _flag(value: Any) -> bool:
    """A boolean option, also as the CLI's string ("0", "false", "no" are False)."""
    return str(value).lower() not in ("0", "false", "no", "off", "")


def llm_attack(inp: ReconstructionInput) -> list[list[int]]:
    """Registry entry ``"llm"`` (options: module docstring). Needs ``inp.backbone`` (the
    encoder's tokenizer turns rows into text and replies back into ids) and ``inp.public_rows``
    (the few-shot examples)."""
    if inp.backbone is None:
        raise ValueError("the LLM attacker needs the backbone (its tokenizer turns privatized "
                         "rows into text and the LLM's replies back into token ids)")
    tok = inp.backbone.tokenizer
    opts = inp.options
    max_rows = opts.get("llm_max_rows")
    n = len(inp.private_rows) if max_rows is None else min(int(max_rows), len(inp.private_rows))

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False).strip()

    # decode() spells the rows' specials ("[CLS]"); reading them back as the special ids keeps
    # the reply aligned with the row (this text is the provider's, from ids, not user text)
    def retokenize(ids: list[int]) -> list[int]:
        return list(tok(decode(ids), add_special_tokens=False,
                        split_special_tokens=False)["input_ids"])

    adapter = _adapter(opts)
    generate, n_llm_tokens, chat_tok = _generator(inp, adapter)
    shots = few_shot_examples(inp, decode, int(opts.get("llm_shots", DEFAULT_SHOTS
                                                        if adapter is None else 0)))
    guesses = [[int(t) for t in r] for r in inp.private_rows]
    targets = [decode(list(r)) for r in inp.private_rows[:n]]
    todo = [i for i in range(n) if targets[i]]
    replies = generate([build_prompt(shots, targets[i], chat_tok) for i in todo],
                       [math.ceil(NEW_TOKENS_FACTOR * n_llm_tokens(targets[i])) for i in todo])
    tuned_cap = None if adapter is None else adapter.config.max_change
    max_change = float(opts.get("llm_max_change", DEFAULT_MAX_CHANGE if tuned_cap is None
                                else tuned_cap))
    for i, reply in zip(todo, replies, strict=True):
        line = reply.strip().split("\n", 1)[0].strip()
        out = (tok(line, add_special_tokens=False, split_special_tokens=False)["input_ids"]
               if line else [])
        guess = align_guess(inp.private_rows[i], out, special_ids=inp.special_ids,
                            retokenize=retokenize)
        if changed_share(inp.private_rows[i], guess, inp.special_ids) <= max_change:
            guesses[i] = guess
    return guesses


def changed_share(received: Sequence[int], guess: Sequence[int],
                  special_ids: Sequence[int] = ()) -> float:
    """Share of the non-special positions of a row that ``guess`` changes (0 for none)."""
    special = {int(i) for i in special_ids}
    pos = [(r, g) for r, g in zip(received, guess, strict=True) if int(r) not in special]
    return sum(int(r) != int(g) for r, g in pos) / len(pos) if pos else 0.0


register_attacker("llm", llm_attack)
