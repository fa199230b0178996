"""Black-box LLM label scorer: prompt text in, next-token probabilities of the label words out.

PromptPATE and the prompt membership-inference attack reach the LLM only through
:class:`LabelScorer`, so a remote completion API could stand behind it. A prompt is split into a
``prefix`` (instruction + demonstrations, fixed per teacher) and a ``suffix`` (the query); the
LLM sees ``prefix + suffix`` and the scorer returns, for each suffix, the probability of each label
word's first token as the next token (softmax over the whole vocabulary, so rows sum to <= 1).

:class:`HFLabelScorer` runs a local Hugging Face causal LM on the joint tokenization of
``prefix + suffix``. By default it encodes each prefix once, keeps its key/value cache, and runs
batches of suffixes on top of it; ``mode="batched"`` re-encodes the full prompt per suffix in
padded batches (the no-cache baseline) and ``mode="naive"`` one prompt at a time (the reference
for correctness).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from transformers import DynamicCache

from rapt.models import Backbone, cache_kwargs, output_cache


class LabelWordError(ValueError):
    """Label words that cannot be told apart by their first token."""


@runtime_checkable
class LabelScorer(Protocol):
    """The one interface PromptPATE and the MIA need from an LLM."""

    label_words: list[str]

    def label_probs(self, prefix: str, suffixes: Sequence[str]) -> np.ndarray:
        """P(first token of label word c | prefix + suffix_i): array (len(suffixes), C)."""
        ...

    def top_labels(self, prefix: str, suffixes: Sequence[str]) -> np.ndarray:
        """Label index of the most likely next token, or -1 where it is no label word: (N,)."""
        ...


def label_token_ids(tokenizer, label_words: Sequence[str]) -> list[int]:
    """First token id of each label word, checking they exist and are pairwise distinct.

    Label words are tokenized as they follow the answer prefix, so include the leading space
    (``" positive"``) for byte-level BPE tokenizers.
    """
    if len(label_words) < 2:
        raise LabelWordError(f"need at least 2 label words, got {list(label_words)!r}")
    ids: list[int] = []
    for w in label_words:
        toks = tokenizer(w, add_special_tokens=False)["input_ids"]
        if not toks:
            raise LabelWordError(f"label word {w!r} tokenizes to no tokens")
        if toks[0] == tokenizer.unk_token_id and tokenizer.unk_token_id is not None:
            raise LabelWordError(f"label word {w!r} starts with the unknown token")
        ids.append(int(toks[0]))
    seen: dict[int, str] = {}
    for w, i in zip(label_words, ids, strict=True):
        if i in seen:
            tok = tokenizer.convert_ids_to_tokens(i)
            raise LabelWordError(
                f"label words {seen[i]!r} and {w!r} share the first token {tok!r} (id {i}); "
                "the scorer reads one next-token probability per label, so pick words whose "
                "first tokens differ"
            )
        seen[i] = w
    return ids


MODES = ("cached", "batched", "naive")


def leading_special_ids(tokenizer) -> list[int]:
    """The ids the tokenizer itself puts before a text with ``add_special_tokens=True``.

    That is the sequence start the model was trained with: ``<s>`` for Llama-2, ``[CLS]`` for a
    BERT tokenizer, nothing for SmolLM2, whose ``bos_token`` (``<|im_start|>``) is a chat-template
    marker that its tokenizer never prepends. Trailing specials (``[SEP]``, EOS) are left out:
    the scorer reads the next token after the query, so the text must not look finished.
    """
    probe = "a"
    with_sp = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    plain = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    # Whatever comes before the text's own ids is the start; a post-processor's token need not
    # be registered as special on the Python side, so no check against all_special_ids.
    for k in range(len(with_sp) - len(plain) + 1):
        if with_sp[k:k + len(plain)] == plain:
            return with_sp[:k]
    return []


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class HFLabelScorer:
    """:class:`LabelScorer` over a Hugging Face causal LM with prefix key/value-cache reuse.

    Every prompt is tokenized as one string, ``prefix + suffix``: tokenizing the two parts apart
    gives sequences the text never produces (byte-level BPE merges across the boundary, e.g.
    ``"…positive\\n\\n" + "Review:"`` is ``Ċ Ċ Review`` jointly but ``ĊĊ`` + ``Review`` apart).
    The sequence starts with what the tokenizer itself prepends (:func:`leading_special_ids`).

    ``mode``:

    * ``"cached"`` (default): the prefix is encoded once and its key/value cache kept (the most
      recent prefix only, so calling again with the same prefix encodes nothing new). Each query
      reuses the cache up to the longest common token prefix of the prefix's own tokens and the
      joint tokens, and runs the rest of its joint tokens on top.
    * ``"batched"``: no cache; the full joint prompt of every query is encoded, batched with
      padding like the cached mode (the baseline that isolates what the cache itself gains).
    * ``"naive"``: no cache, one query at a time, the plain model forward (the reference for
      correctness). ``naive=True`` is the older spelling of ``mode="naive"``.

    Up to ``batch_size`` queries of similar length (longest <= ``pad_slack`` x shortest + 2
    tokens) run together; in cached mode on one copy of the prefix cache expanded over the batch.
    """

    def __init__(self, backbone: Backbone, label_words: Sequence[str], *, batch_size: int = 32,
                 pad_slack: float = 1.25, naive: bool = False, mode: str | None = None) -> None:
        if backbone.kind != "causal":
            raise ValueError(f"backbone '{backbone.name}' is a {backbone.kind}, need a causal LM")
        if mode is None:
            mode = "naive" if naive else "cached"
        elif naive and mode != "naive":
            raise ValueError(f"naive=True contradicts mode={mode!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        self.mode = mode
        self.naive = mode == "naive"
        self.backbone = backbone
        self.model = backbone.model
        self.tokenizer = backbone.tokenizer
        self.label_words = list(label_words)
        self.label_ids = label_token_ids(self.tokenizer, self.label_words)
        self.batch_size = int(batch_size)
        self.pad_slack = float(pad_slack)
        self.device = next(self.model.parameters()).device
        self.start_ids = leading_special_ids(self.tokenizer)
        self._label_index = torch.tensor(self.label_ids, device=self.device)
        self._cached_prefix: str | None = None
        self._cached_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.n_votes = 0  # suffixes scored so far (for votes/s accounting)
        self.n_prefix_encodings = 0  # prefix caches built + prompts encoded from their start

    # -- tokenization ---------------------------------------------------------------------
    def encode_prefix(self, prefix: str) -> list[int]:
        """Start ids (see :func:`leading_special_ids`) + the prefix text, as the cache holds it."""
        ids = self.tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []
        return self.start_ids + list(ids)

    def encode_suffix(self, suffix: str) -> list[int]:
        """The query's tokens on its own (only to reject empty queries and for statistics: the
        model always sees :meth:`encode`)."""
        ids = self.tokenizer(suffix, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError("empty query: the suffix tokenizes to no tokens")
        return list(ids)

    def encode(self, prefix: str, suffix: str) -> list[int]:
        """What the model sees: start ids + the tokens of ``prefix + suffix`` as one string."""
        self.encode_suffix(suffix)
        return self.start_ids + list(self.tokenizer(prefix + suffix,
                                                    add_special_tokens=False)["input_ids"])

    # -- scoring --------------------------------------------------------------------------
    def label_probs(self, prefix: str, suffixes: Sequence[str]) -> np.ndarray:
        return self._label_logprobs(prefix, suffixes)[0].exp().numpy().astype(np.float64)

    def top_labels(self, prefix: str, suffixes: Sequence[str]) -> np.ndarray:
        _, top = self._label_logprobs(prefix, suffixes)
        return top.numpy()

    @torch.inference_mode()
    def next_token_logits(self, prefix: str, suffixes: Sequence[str]) -> torch.Tensor:
        """Logits of the token after ``prefix + suffix_i`` over the whole vocabulary: (N, V)."""
        joint = [self.encode(prefix, s) for s in suffixes]
        if not joint:
            return torch.zeros(0, self.model.get_output_embeddings().weight.shape[0])
        if self.mode == "naive":
            logits = torch.cat([self._last_logits_full(ids) for ids in joint], dim=0)
        else:
            p_ids = self.encode_prefix(prefix)
            if self.mode == "cached" and p_ids:
                kv = self._prefix_cache(prefix, p_ids)
                # Re-split each query at the longest common token prefix rather than use the
                # cache only when all prefix tokens survive the join: with byte-level BPE the
                # prefix's last token rarely does (PromptPATE's prefixes end in "\n\n", tokenized
                # ĊĊ alone but Ċ Ċ before a letter), so an all-or-nothing rule would run nearly
                # every query without the cache. Under causal attention the keys/values of the
                # first L positions depend on those L tokens only, so the first L of the cache
                # are exact for any prompt that starts with the same L tokens. One token is
                # always left to the query: its last position gives the logits.
                starts = [min(common_prefix_len(p_ids, ids), len(ids) - 1) for ids in joint]
            else:
                kv, starts = None, [0] * len(joint)
            logits = self._batched_last_logits(joint, starts, kv)
        return logits.float().cpu()

    def _label_logprobs(self, prefix: str, suffixes: Sequence[str]
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs (N, C) of the label tokens, label index of the argmax token or -1 (N,))."""
        if len(suffixes) == 0:
            return torch.zeros(0, len(self.label_ids)), torch.zeros(0, dtype=torch.long)
        logits = self.next_token_logits(prefix, suffixes)
        self.n_votes += len(suffixes)
        logp = torch.log_softmax(logits, dim=-1)
        top_tok = logp.argmax(dim=-1)
        index = self._label_index.cpu()
        match = top_tok.unsqueeze(1) == index.unsqueeze(0)  # (N, C)
        top = torch.where(match.any(dim=1), match.float().argmax(dim=1),
                          torch.full_like(top_tok, -1))
        return logp[:, index], top

    def _batched_last_logits(self, joint: list[list[int]], starts: list[int],
                             kv: list[tuple[torch.Tensor, torch.Tensor]] | None) -> torch.Tensor:
        """Each ``joint[i][starts[i]:]`` on top of the first ``starts[i]`` cached positions
        (none when ``starts[i] == 0``), batched by split point and similar length: (N, V)."""
        out: list[torch.Tensor | None] = [None] * len(joint)
        for start in sorted(set(starts)):
            group = [i for i in range(len(joint)) if starts[i] == start]
            order = sorted(group, key=lambda i: len(joint[i]))
            for batch in self._length_buckets([len(joint[i]) - start for i in order], order):
                rows = self._last_logits(kv if start else None, start,
                                         [joint[i][start:] for i in batch])
                for i, row in zip(batch, rows, strict=True):
                    out[i] = row
            if start == 0:
                self.n_prefix_encodings += len(group)
        return torch.stack(out)  # type: ignore[arg-type]

    def _length_buckets(self, lens: list[int], order: list[int]) -> list[list[int]]:
        """Split length-sorted indices into batches of <= batch_size whose longest suffix is at
        most ``pad_slack`` x the shortest (+2): padding is compute on a CPU, where a batch of
        a few 30-token queries already keeps the matrix units busy."""
        batches: list[list[int]] = []
        cur: list[int] = []
        shortest = 0
        for n, j in zip(lens, order, strict=True):
            if cur and (len(cur) >= self.batch_size or n > self.pad_slack * shortest + 2):
                batches.append(cur)
                cur = []
            if not cur:
                shortest = n
            cur.append(j)
        return [*batches, cur] if cur else batches

    def _last_logits_full(self, ids: list[int]) -> torch.Tensor:
        """Naive path: the whole prompt through the model, logits of the last position (1, V)."""
        x = torch.tensor([ids], device=self.device)
        out = self.model(input_ids=x, use_cache=False, logits_to_keep=1)
        self.n_prefix_encodings += 1
        return out.logits[:, -1, :]

    def _prefix_cache(self, prefix: str, p_ids: list[int]
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self._cached_prefix != prefix or self._cached_kv is None:
            x = torch.tensor([p_ids], device=self.device)
            # The body only: the prefix needs no logits, and the LM head over a long prefix
            # would cost about a seventh of the prefix pass for SmolLM2's 49k vocabulary.
            cache = output_cache(self.model.base_model(input_ids=x, use_cache=True))
            # Keep plain tensors, not the Cache object: a forward pass appends to a DynamicCache
            # in place, so every batch gets a fresh cache built from these (never mutated).
            self._cached_kv = [(layer.keys, layer.values) for layer in cache.layers]
            self._cached_prefix = prefix
            self.n_prefix_encodings += 1
        return self._cached_kv

    def _last_logits(self, kv: list[tuple[torch.Tensor, torch.Tensor]] | None, p_len: int,
                     batch: list[list[int]]) -> torch.Tensor:
        """Token rows (right-padded) after the first ``p_len`` cached positions (or from the
        start when ``kv`` is None); logits at each row's last token (B, V)."""
        b = len(batch)
        lens = torch.tensor([len(s) for s in batch], device=self.device)
        width = int(lens.max())
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((b, width), pad, dtype=torch.long, device=self.device)
        for i, s in enumerate(batch):
            ids[i, : len(s)] = torch.tensor(s, device=self.device)
        # Right padding keeps every real token at its true position p_len + j; the padded tail
        # is masked out and never read.
        attn = (torch.arange(width, device=self.device)[None, :] < lens[:, None]).long()
        cache = None
        if kv is not None:
            attn = torch.cat([torch.ones(b, p_len, dtype=torch.long, device=self.device), attn],
                             dim=1)
            cache = DynamicCache(
                [(k[:, :, :p_len].expand(b, -1, -1, -1), v[:, :, :p_len].expand(b, -1, -1, -1))
                 for k, v in kv],
                config=self.model.config,
            )
        pos = torch.arange(p_len, p_len + width, device=self.device)
        body = self.model.base_model
        out = body(input_ids=ids, attention_mask=attn, use_cache=cache is not None,
                   position_ids=pos.unsqueeze(0).expand(b, -1), **cache_kwargs(body, cache))
        hidden = out.last_hidden_state[torch.arange(b, device=self.device), lens - 1]  # (B, d)
        return self.model.get_output_embeddings()(hidden)


def normalize(p: np.ndarray) -> np.ndarray:
    """Rows renormalized to sum to 1 over the label words."""
    p = np.asarray(p, dtype=np.float64)
    return p / np.clip(p.sum(axis=-1, keepdims=True), 1e-300, None)
