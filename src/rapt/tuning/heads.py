"""Task heads: a linear classifier on pooled states, a verbalizer over a causal LM head, and a
frozen label-description head for sentence encoders.

All take the tuner's hidden states ``(B, n, h)`` (aligned with the input positions) and a
``task_mask`` ``(B, n)`` that is 1 on the positions the task may read: the real input, not
padding and not the RAPT plain tokens (the paper's G_{m:m+n}).

RAPT predicts through the language-model head (eq. 8), so the *prompt* carries the task. A
freshly trained linear head on pooled states is a linear probe that needs no prompt, and then the
reconstruction loss (which acts only through the prompt) has nothing to improve. The verbalizer
(causal LMs) and the label-description head (encoders without an MLM head) are frozen: only the
prompt can steer them. The linear head stays available as an option and a control.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from rapt.config import DEFAULT_TEMPERATURE

Pooling = Literal["mean", "cls", "last"]


def pool(hidden: Tensor, task_mask: Tensor, pooling: Pooling) -> Tensor:
    """(B, n, h) -> (B, h). ``mean`` over task positions, ``cls`` = position 0 (encoders: [CLS]),
    ``last`` = the last task position (causal LMs: the state that predicts the next token)."""
    if pooling == "mean":
        m = task_mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        idx = last_positions(task_mask)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]
    raise ValueError(f"unknown pooling {pooling!r}")


def last_positions(mask: Tensor) -> Tensor:
    """Index of the last 1 in each row of ``mask`` (B, n) -> (B,); right padding assumed."""
    n = mask.shape[1]
    ar = torch.arange(n, device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), ar, torch.full_like(ar, -1)).amax(1).clamp_min(0)


class ClassificationHead(nn.Module):
    """Linear classifier on pooled states. Mean pooling is the default because MiniLM
    (all-MiniLM-L6-v2) was trained as a mean-pooling sentence encoder; its [CLS] state carries
    little sentence-level information."""

    def __init__(self, hidden_size: int, num_labels: int, pooling: Pooling = "mean",
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.pooling = pooling
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(hidden_size, num_labels)

    def forward(self, hidden: Tensor, task_mask: Tensor) -> Tensor:
        """-> logits (B, C)."""
        return self.from_pooled(pool(hidden, task_mask, self.pooling))

    def from_pooled(self, pooled: Tensor) -> Tensor:
        """(B, h) pooled states -> logits (B, C): the head after its pooling (a user-side
        output denoiser corrects the pooled state and hands it here)."""
        return self.linear(self.dropout(pooled))


class Verbalizer(nn.Module):
    """Label words scored by the (frozen) LM head at the last input position.

    ``label_token_ids[c]`` is the first token of label word c (see :func:`label_token_ids`).
    The LM head is borrowed, not registered, so it is not saved.
    """

    def __init__(self, lm_head: nn.Module, label_token_ids: list[int]) -> None:
        super().__init__()
        if len(set(label_token_ids)) != len(label_token_ids):
            raise ValueError(f"label words share a first token: {label_token_ids}; "
                             "give distinct label words")
        self._lm_head = [lm_head]
        self.register_buffer("label_token_ids", torch.tensor(label_token_ids, dtype=torch.long),
                             persistent=False)

    def forward(self, hidden: Tensor, task_mask: Tensor) -> Tensor:
        """-> logits (B, C): the LM logits of the label words' first tokens."""
        last = pool(hidden, task_mask, "last")
        head = self._lm_head[0]
        if isinstance(head, nn.Linear):
            # Only C rows of the (V, h) output matrix are needed: skip the full-vocabulary matmul.
            w = head.weight[self.label_token_ids]
            b = head.bias[self.label_token_ids] if head.bias is not None else None
            return nn.functional.linear(last, w, b)
        return head(last)[:, self.label_token_ids]


def label_token_ids(tokenizer, label_words: list[str]) -> list[int]:
    """First token id of each label word as the LM would continue the input: " word" (with a
    leading space) when those first tokens are all distinct, else "word" when those are (a
    GPT-2-style tokenizer such as SmolLM2's splits " 0" and " 1" into " " + digit, so with the
    space every digit label starts with the same token). A ValueError names both attempts
    when neither works."""
    tried = []
    for prefix in (" ", ""):
        ids = []
        for w in label_words:
            enc = tokenizer(prefix + w.strip(), add_special_tokens=False)["input_ids"]
            if not enc:
                raise ValueError(f"label word {w!r} tokenizes to nothing")
            ids.append(int(enc[0]))
        if len(set(ids)) == len(ids):
            return ids
        tried.append(ids)
    raise ValueError(f"label words {', '.join(repr(w) for w in label_words)} share a first "
                     f"token with a leading space ({tried[0]}) and without one ({tried[1]}), so "
                     "the verbalizer cannot tell them apart")


# Which encoder head lets the prompt carry the task. Measured on minilm (all-MiniLM-L6-v2),
# sst2-sentences 400 train / 200 dev (subset seed 0), prompt tuning, 20 virtual tokens, lr 2e-2,
# batch 16, 8 epochs = 200 steps, max length 64, one thread; dev accuracy with the prompt frozen
# at its init ("head only": the linear head still trains, a frozen head is just evaluated) and
# with the prompt trained; privatized rows at P = 0.42 (η = 78.8, calibrated for P = 0.4):
#
#   head                                   no privacy          P = 0.42
#                                          head only  trained  head only  trained
#   linear on mean-pooled states             0.755     0.810    0.630     0.645
#   label description, cos / 0.05            0.575     0.780    0.550     0.720
#   tied input embeddings at [MASK]          0.535     0.635    0.535     0.540
#
# The linear head is a linear probe: it gets 0.755 with a random prompt, and training the prompt
# adds 5 points (1.5 under privatization), so a loss acting only through the prompt (RAPT's
# L_rec) has little to improve. With the frozen label-description head the prompt carries the
# task (+20 and +17 points), and under privatization it beats the linear head (0.720 vs 0.645:
# the probe overfits the noisy rows, training loss 0.17). MiniLM has no MLM head, and its
# output states at [MASK] do not live in the input-embedding space ("terrible"/"great"), so the
# tied-embedding verbalizer barely learns. Descriptions "a negative review" / "a positive review".
# DEFAULT_TEMPERATURE (0.05) lives in rapt.config with the other defaults.


class LabelDescriptionHead(nn.Module):
    """Frozen head for sentence encoders (all-MiniLM ships no MLM head): the logit of class c is
    cos(pool(H), e_c) / temperature, where e_c is the pooled embedding of a label description
    ("a negative review", ...) encoded by the same backbone *without* the prompt.

    This is what all-MiniLM-L6-v2 was trained for (cosine similarity of mean-pooled sentence
    embeddings, contrastive loss with scale 20 = 1 / 0.05), so the temperature is fixed at
    0.05 rather than learned: the head has no trainable parameter at all, the prompt alone must
    move the sentence embedding towards the right description, and under PromptDPSGD there is
    no extra parameter that would need a per-example gradient path. ``label_embeddings`` is a
    buffer saved with the artifact (recomputing it at load would tie predictions to the exact
    backbone numerics; the saved copy makes the round trip exact).
    """

    def __init__(self, label_embeddings: Tensor, pooling: Pooling = "mean",
                 temperature: float = DEFAULT_TEMPERATURE) -> None:
        super().__init__()
        if label_embeddings.dim() != 2 or label_embeddings.shape[0] < 2:
            raise ValueError("label_embeddings must be (C, h) with C >= 2 "
                             f"(got shape {tuple(label_embeddings.shape)})")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 (got {temperature})")
        self.pooling = pooling
        self.temperature = float(temperature)
        self.register_buffer("label_embeddings", label_embeddings.detach().float().clone())

    def forward(self, hidden: Tensor, task_mask: Tensor) -> Tensor:
        """-> logits (B, C) = cos(pooled state, label embedding) / temperature."""
        return self.from_pooled(pool(hidden, task_mask, self.pooling))

    def from_pooled(self, pooled: Tensor) -> Tensor:
        """(B, h) pooled states -> logits (B, C)."""
        pooled = pooled.float()
        cos = nn.functional.normalize(pooled, dim=-1) @ \
            nn.functional.normalize(self.label_embeddings, dim=-1).T
        return cos / self.temperature


@torch.no_grad()
def encode_descriptions(backbone, descriptions: Sequence[str], pooling: Pooling = "mean",
                        batch_size: int = 32) -> Tensor:
    """(C, h) pooled sentence embeddings of ``descriptions`` from the frozen backbone, no prompt:
    the tokenizer's own special tokens, pooling over the attention mask (as sentence-transformers
    mean pooling does)."""
    from rapt.tuning.tuners import base_model

    if len(descriptions) < 2 or any(not str(d).strip() for d in descriptions):
        raise ValueError("need at least 2 non-empty label descriptions, "
                         f"got {list(descriptions)!r}")
    body = base_model(backbone.model)
    dev = next(iter(backbone.model.parameters())).device
    was_training = body.training
    body.eval()
    out = []
    try:
        for s in range(0, len(descriptions), batch_size):
            rows = backbone.tokenizer([str(d) for d in descriptions[s:s + batch_size]],
                                      add_special_tokens=True)["input_ids"]
            n = max(len(r) for r in rows)  # right padding: "last" pooling expects it
            ids = torch.full((len(rows), n), int(backbone.tokenizer.pad_token_id or 0))
            mask = torch.zeros((len(rows), n), dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, :len(r)] = torch.as_tensor(r, dtype=torch.long)
                mask[i, :len(r)] = 1
            ids, mask = ids.to(dev), mask.to(dev)
            hidden = body(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            out.append(pool(hidden, mask, pooling).float().cpu())
    finally:
        body.train(was_training)
    emb = torch.cat(out)
    norms = emb.norm(dim=-1)
    if bool((norms == 0).any()):
        raise ValueError("a label description encodes to the zero vector")
    return emb


def head_from_tensors(kind: str, tensors: dict[str, Tensor], *,
                      temperature: float | None = None) -> nn.Module:
    """A task head rebuilt from its saved tensors (``head.<name>`` keys, as a TunedPrompt
    saves them), to run on pooled states away from the backbone (a user-side output
    denoiser's corrected states): ``linear`` (``head.linear.weight`` / ``.bias``) or
    ``label-description`` (``head.label_embeddings`` and ``temperature``). Eval mode."""
    state = {k[len("head."):]: v for k, v in tensors.items() if k.startswith("head.")}
    if kind == "linear":
        w = state.get("linear.weight")
        if w is None or w.dim() != 2:
            raise ValueError("a linear head needs head.linear.weight (C, h)")
        head: nn.Module = ClassificationHead(w.shape[1], w.shape[0])
    elif kind == "label-description":
        if "label_embeddings" not in state:
            raise ValueError("a label-description head needs head.label_embeddings (C, h)")
        head = LabelDescriptionHead(state["label_embeddings"], temperature=float(
            temperature if temperature is not None else DEFAULT_TEMPERATURE))
    else:
        raise ValueError(f"the {kind} head reads no pooled state")
    head.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return head.eval()
