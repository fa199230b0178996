"""Black-box LLM label scorer: prompt text in, next-token probabilities of the label words out.

PromptPATE and the prompt membership-inference attack reach the LLM only through
:class:`LabelScorer`, so a remote completion API could stand behind it. A prompt is split into a
``prefix`` (instruction + demonstrations, fixed per teacher) and a ``suffix`` (the query); the
LLM sees ``prefix + suffix`` and the scorer returns, for each suffix, the probability of each label
word's first token as the next token (softmax over the whole vocabulary, so rows sum to <= 1).

:class:`HFLabelScorer` runs a local Hugging Face causal LM. It encodes each prefix once, keeps
its key/value cache, and runs batches of suffixes on top of that cache; ``naive=True`` re-encodes
the full prompt for every suffix, one at a time (the reference for correctness and speed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from transformers import DynamicCache

from rapt.models import Backbone


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


class HFLabelScorer:
    """:class:`LabelScorer` over a Hugging Face causal LM with prefix key/value-cache reuse.

    Up to ``batch_size`` suffixes of similar length (longest <= ``pad_slack`` x shortest + 2
    tokens) run together on one copy of the prefix cache, expanded over the batch. The cache of
    the most recent prefix is kept, so calling again with the same prefix encodes nothing new.
    """

    def __init__(self, backbone: Backbone, label_words: Sequence[str], *, batch_size: int = 32,
                 pad_slack: float = 1.25, naive: bool = False) -> None:
        if backbone.kind != "causal":
            raise ValueError(f"backbone '{backbone.name}' is a {backbone.kind}, need a causal LM")
        self.backbone = backbone
        self.model = backbone.model
        self.tokenizer = backbone.tokenizer
        self.label_words = list(label_words)
        self.label_ids = label_token_ids(self.tokenizer, self.label_words)
        self.batch_size = int(batch_size)
        self.pad_slack = float(pad_slack)
        self.naive = naive
        self.device = next(self.model.parameters()).device
        self._label_index = torch.tensor(self.label_ids, device=self.device)
        self._cached_prefix: str | None = None
        self._cached_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._cached_len = 0
        self.n_votes = 0  # suffixes scored so far (for votes/s accounting)
        self.n_prefix_encodings = 0

    # -- tokenization ---------------------------------------------------------------------
    def encode_prefix(self, prefix: str) -> list[int]:
        """Prefix token ids: BOS (if the tokenizer has one) + the text, no other specials."""
        ids = self.tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []
        bos = self.tokenizer.bos_token_id
        return ([bos] if bos is not None else []) + list(ids)

    def encode_suffix(self, suffix: str) -> list[int]:
        ids = self.tokenizer(suffix, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError("empty query: the suffix tokenizes to no tokens")
        return list(ids)

    # -- scoring --------------------------------------------------------------------------
    def label_probs(self, prefix: str, suffixes: Sequence[str]) -> np.ndarray:
        return self._label_logprobs(prefix, suffixes)[0].exp().numpy().astype(np.float64)

    def top_labels(self, prefix: str, suffixes: Sequence[str]) -> np.ndarray:
        _, top = self._label_logprobs(prefix, suffixes)
        return top.numpy()

    @torch.inference_mode()
    def _label_logprobs(self, prefix: str, suffixes: Sequence[str]
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs (N, C) of the label tokens, label index of the argmax token or -1 (N,))."""
        if len(suffixes) == 0:
            return torch.zeros(0, len(self.label_ids)), torch.zeros(0, dtype=torch.long)
        p_ids = self.encode_prefix(prefix)
        s_ids = [self.encode_suffix(s) for s in suffixes]
        if self.naive or not p_ids:
            rows = [self._last_logits_full(p_ids + s) for s in s_ids]
            logits = torch.cat(rows, dim=0)
        else:
            kv = self._prefix_cache(prefix, p_ids)
            order = sorted(range(len(s_ids)), key=lambda i: len(s_ids[i]))
            chunks = [self._last_logits_cached(kv, len(p_ids), [s_ids[j] for j in batch])
                      for batch in self._length_buckets([len(s_ids[j]) for j in order], order)]
            stacked = torch.cat(chunks, dim=0)
            logits = torch.empty_like(stacked)
            logits[torch.tensor(order, device=logits.device)] = stacked
        self.n_votes += len(suffixes)
        logp = torch.log_softmax(logits.float(), dim=-1)
        top_tok = logp.argmax(dim=-1)
        match = top_tok.unsqueeze(1) == self._label_index.unsqueeze(0)  # (N, C)
        top = torch.where(match.any(dim=1), match.float().argmax(dim=1),
                          torch.full_like(top_tok, -1))
        return logp[:, self._label_index].cpu(), top.cpu()

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
            cache = self.model.base_model(input_ids=x, use_cache=True).past_key_values
            # Keep plain tensors, not the Cache object: a forward pass appends to a DynamicCache
            # in place, so every batch gets a fresh cache built from these (never mutated).
            self._cached_kv = [(layer.keys, layer.values) for layer in cache.layers]
            self._cached_prefix = prefix
            self._cached_len = len(p_ids)
            self.n_prefix_encodings += 1
        return self._cached_kv

    def _last_logits_cached(self, kv: list[tuple[torch.Tensor, torch.Tensor]], p_len: int,
                            batch: list[list[int]]) -> torch.Tensor:
        """Suffixes (right-padded) on top of the prefix cache; logits at each last token (B, V)."""
        b = len(batch)
        lens = torch.tensor([len(s) for s in batch], device=self.device)
        width = int(lens.max())
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((b, width), pad, dtype=torch.long, device=self.device)
        for i, s in enumerate(batch):
            ids[i, : len(s)] = torch.tensor(s, device=self.device)
        # Right padding keeps every real suffix token at its true position p_len + j; the padded
        # tail is masked out and never read.
        suffix_mask = (torch.arange(width, device=self.device)[None, :] < lens[:, None]).long()
        attn = torch.cat([torch.ones(b, p_len, dtype=torch.long, device=self.device),
                          suffix_mask], dim=1)
        cache = DynamicCache(
            [(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)) for k, v in kv],
            config=self.model.config,
        )
        pos = torch.arange(p_len, p_len + width, device=self.device)
        out = self.model.base_model(input_ids=ids, attention_mask=attn, past_key_values=cache,
                                    use_cache=True, position_ids=pos.unsqueeze(0).expand(b, -1))
        hidden = out.last_hidden_state[torch.arange(b, device=self.device), lens - 1]  # (B, d)
        return self.model.get_output_embeddings()(hidden)


def normalize(p: np.ndarray) -> np.ndarray:
    """Rows renormalized to sum to 1 over the label words."""
    p = np.asarray(p, dtype=np.float64)
    return p / np.clip(p.sum(axis=-1, keepdims=True), 1e-300, None)
