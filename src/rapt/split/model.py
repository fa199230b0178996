"""Cut a backbone into the customer's bottom and the provider's top.

One abstraction for both families the project ships: BERT-style encoders (``minilm``: an
embedding module that adds positions and normalises, blocks called with a bidirectional mask)
and Llama-style causal LMs (``smollm2-135m``: bare token embeddings, blocks called with a causal
mask and rotary position embeddings, a final norm). :class:`_Blocks` hides those differences;
:class:`Bottom` and :class:`Top` are the same code for both. Each side holds *copies* of its
modules, so the shared backbone is never changed (LoRA is injected into the top's copy, an
unfrozen bottom trains its own copy).
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from torch import Tensor, nn

from rapt.models import Backbone, cache_kwargs
from rapt.tuning.tuners import base_model

__all__ = ["Bottom", "Top", "split_backbone"]

Style = Literal["bert", "llama"]


def _style(body: nn.Module) -> Style:
    if hasattr(body, "embeddings") and hasattr(getattr(body, "encoder", None), "layer"):
        return "bert"
    if all(hasattr(body, a) for a in ("embed_tokens", "layers", "rotary_emb")):
        return "llama"
    raise ValueError(f"cannot split a {type(body).__name__}: split_backbone knows BERT-style "
                     "bodies (embeddings + encoder.layer) and Llama-style bodies (embed_tokens "
                     "+ layers + rotary_emb)")


class _Blocks(nn.Module):
    """A contiguous range of transformer blocks, run as the whole body would run them."""

    def __init__(self, style: Style, config, layers: list[nn.Module],
                 rotary: nn.Module | None) -> None:
        super().__init__()
        self.style = style
        self.config = config
        self.layers = nn.ModuleList(layers)
        self.rotary = rotary  # no trainable weights; each side needs its own for positions

    def forward(self, h: Tensor, mask: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """(B, n, h), mask (B, n) -> (B, n, h)."""
        if len(self.layers) == 0:
            return h
        from transformers.masking_utils import create_bidirectional_mask, create_causal_mask

        if self.style == "bert":
            m = create_bidirectional_mask(config=self.config, inputs_embeds=h,
                                          attention_mask=mask)
            for layer in self.layers:
                h = layer(h, m)
            return h
        pos = position_ids if position_ids is not None else \
            torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        m = create_causal_mask(config=self.config, inputs_embeds=h, attention_mask=mask,
                               position_ids=pos, **cache_kwargs(create_causal_mask, None))
        pe = self.rotary(h, position_ids=pos)
        for layer in self.layers:
            h = layer(h, attention_mask=m, position_embeddings=pe, position_ids=pos)
        return h


class Bottom(nn.Module):
    """Customer side: the embedding layer and the first ``n`` blocks.

    ``forward(ids, mask)`` takes token ids that the customer has *already privatized* (dχ noise
    on the token embedding, then the nearest vocabulary token: SAP eqs. 3-4) and returns the
    representation it releases, (B, n_tokens, h)."""

    def __init__(self, style: Style, embed: nn.Module, blocks: _Blocks) -> None:
        super().__init__()
        self.style = style
        self.embed = embed
        self.blocks = blocks

    @property
    def num_blocks(self) -> int:
        return len(self.blocks.layers)

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.embed.word_embeddings if self.style == "bert" else self.embed

    def from_word_embeddings(self, x: Tensor, mask: Tensor) -> Tensor:
        """Bottom output from word vectors (B, n, h) instead of ids: the path the inversion
        attack differentiates through with its soft token mixtures."""
        h = self.embed(inputs_embeds=x) if self.style == "bert" else x
        return self.blocks(h, mask)

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.from_word_embeddings(self.word_embeddings(ids), mask)

    @torch.no_grad()
    def token_table(self, position: int, ids: Tensor | None = None) -> Tensor:
        """Output of the embedding layer for every token (or ``ids``) at ``position`` (V, h).

        Only meaningful for a bottom without blocks, where the release is position-wise: the
        white-box nearest-neighbour inversion compares each released vector with this table."""
        w = self.word_embeddings.weight
        ids = torch.arange(w.shape[0], device=w.device) if ids is None else ids.to(w.device)
        if self.style == "llama":
            return w[ids]
        pos = torch.full((len(ids), 1), int(position), dtype=torch.long, device=w.device)
        return self.embed(input_ids=ids.unsqueeze(1), position_ids=pos).squeeze(1)


class Top(nn.Module):
    """Provider side: the remaining blocks, the final norm (causal LMs) and pooling.

    ``forward(hidden, mask)`` -> the top's output g, (B, h): the mean over valid positions
    (encoders; MiniLM is a mean-pooling sentence encoder) or the last valid position (causal
    LMs). A prompt-tuned top prepends ``prompt`` (N, h) at its input; LoRA lives inside
    ``blocks``."""

    def __init__(self, blocks: _Blocks, norm: nn.Module | None, pooling: str) -> None:
        super().__init__()
        self.blocks = blocks
        self.norm = norm
        self.pooling = pooling
        self.prompt: nn.Parameter | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks.layers)

    def add_prompt(self, num_virtual_tokens: int, init: Tensor) -> None:
        """Trainable vectors (N, h) prepended to every input of the top (prompt tuning)."""
        self.prompt = nn.Parameter(init.detach().clone().float().reshape(num_virtual_tokens, -1))

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        B, n, _ = hidden.shape
        pos = None
        if self.prompt is not None:
            N = self.prompt.shape[0]
            hidden = torch.cat([self.prompt.to(hidden.dtype).unsqueeze(0).expand(B, -1, -1),
                                hidden], 1)
            mask = torch.cat([mask.new_ones(B, N), mask], 1)
            # The released states carry positions 0..n-1 (the bottom applied them); the
            # virtual tokens sit in front at position 0 rather than shifting the real ones.
            pos = torch.cat([torch.zeros(N, dtype=torch.long, device=hidden.device),
                             torch.arange(n, device=hidden.device)]).unsqueeze(0)
        h = self.blocks(hidden, mask, pos)
        if self.norm is not None:
            h = self.norm(h)
        if self.prompt is not None:
            h, mask = h[:, self.prompt.shape[0]:], mask[:, self.prompt.shape[0]:]
        if self.pooling == "last":
            last = (mask.long().cumsum(1).argmax(1))  # right padding: last 1 of each row
            return h[torch.arange(B, device=h.device), last]
        m = mask.to(h.dtype).unsqueeze(-1)
        return (h * m).sum(1) / m.sum(1).clamp_min(1.0)


def split_backbone(bb: Backbone, n: int, *, pooling: str = "auto") -> tuple[Bottom, Top]:
    """Cut ``bb`` after ``n`` blocks (0 = the embedding layer only) -> (Bottom, Top).

    Both parts are deep copies in eval mode (dropout off); the backbone stays untouched.
    ``pooling``: "mean" / "last" / "auto" (mean for encoders, last for causal LMs)."""
    body = base_model(bb.model)
    style = _style(body)
    layers = list(body.encoder.layer if style == "bert" else body.layers)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(layers) - 1:
        raise ValueError(f"split layer must be an integer in 0..{len(layers) - 1} for "
                         f"{bb.name!r} ({len(layers)} blocks; the top keeps at least one), "
                         f"got {n!r}")
    if pooling == "auto":
        pooling = "mean" if bb.kind == "encoder" else "last"
    if pooling not in ("mean", "last"):
        raise ValueError(f"pooling must be mean, last or auto, got {pooling!r}")
    cfg = body.config
    rotary = body.rotary_emb if style == "llama" else None
    embed = body.embeddings if style == "bert" else body.embed_tokens
    bottom = Bottom(style, copy.deepcopy(embed),
                    _Blocks(style, cfg, copy.deepcopy(layers[:n]), copy.deepcopy(rotary)))
    norm = copy.deepcopy(body.norm) if style == "llama" else None
    top = Top(_Blocks(style, cfg, copy.deepcopy(layers[n:]), copy.deepcopy(rotary)), norm,
              pooling)
    for part in (bottom, top):
        part.eval()
        for p in part.parameters():
            p.requires_grad_(False)
    return bottom, top
