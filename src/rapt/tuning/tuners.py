"""Parameter-efficient tuners over any backbone: prompt, prefix (deep prompts), LoRA, full.

Every tuner is an ``nn.Module`` with ``forward(input_ids, attention_mask) -> (B, n, h)``: the
backbone's last-layer hidden states *aligned with the input positions* (virtual prompt positions
are stripped), so heads and the reconstruction loss index plain-token positions the same way for
every method.

Prompt and prefix tuning are written here rather than through ``peft``'s PromptTuning /
PrefixTuning models because RAPT and PromptDPSGD need two things those models do not expose:
(a) the hidden states of the input positions for encoders (peft's prompt-tuning wrapper is built
around task model classes and its prefix path for BERT relies on the legacy tuple
``past_key_values`` that transformers 5 removed), and (b) the *broadcast protocol*
(``per_example_tensors()``): the prompt/prefix parameter ``p`` is expanded to ``(B, *p.shape)``
in the forward pass and the gradient of that expanded tensor is the per-example gradient.
Prefix key/values are injected with a pre-filled ``transformers.DynamicCache``, which both
``BertModel`` and the Llama family accept; positions of the real tokens stay 0..n-1.
LoRA uses :func:`add_lora` (``peft.inject_adapter_in_model``) on a private copy of the backbone;
:func:`add_lora` is also how the split top, the channel adapter and the denoiser get theirs.

Sentence pairs on BERT-style bodies (a token-type embedding with 2+ types) get the segment ids
their tokenizer gives them, 0 for ``[CLS] a [SEP]`` and 1 for ``b [SEP]``, recomputed from the
row's [SEP] ids (:func:`segment_ids`): rows travel as ids only, and specials are never
privatized, so user, trainer and service derive the same ids. Single texts get all 0, as before.

``prompt_forward`` and ``prefix_forward`` take per-row prompts / key/values, so the service's
mixed-task passes (``rapt.service.mixed``) run rows of many prompts through the same code.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from rapt.config import METHODS  # noqa: F401  (one list, shared with TuneConfig)
from rapt.models import Backbone

Method = Literal["prompt", "prefix", "lora", "full"]


def base_model(model: nn.Module) -> nn.Module:
    """The transformer body that returns ``last_hidden_state`` (no LM head)."""
    if hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
        body = getattr(model, model.base_model_prefix, None)
        if body is not None:
            return body
    return model


def segment_ids(input_ids: Tensor, attention_mask: Tensor, sep_id: int) -> Tensor:
    """BERT token type ids (B, n) of rows ``[CLS] (k) a [SEP] b [SEP]``: 1 from the token after
    the first [SEP] on, 0 before it and on padding; all 0 for a single text."""
    is_sep = (input_ids == sep_id).long()
    before = is_sep.cumsum(1) - is_sep
    return ((before > 0) & attention_mask.bool()).long()


def segment_sep_id(backbone: Backbone) -> int | None:
    """The separator that starts segment 1, or None when the body has no token types (causal
    LMs, RoBERTa's single type)."""
    types = getattr(backbone.model.config, "type_vocab_size", None) or 0
    sep = getattr(backbone.tokenizer, "sep_token_id", None)
    return int(sep) if types >= 2 and sep is not None else None


def copy_without_hooks(model: nn.Module) -> nn.Module:
    """``copy.deepcopy(model)`` minus forward/backward hooks: hooks that others registered on the
    shared backbone (the service's pass counter, a bound method of an object holding locks) can
    neither be copied nor belong on a private copy."""
    memo: dict[int, object] = {}
    for m in model.modules():
        for name in ("_forward_hooks", "_forward_hooks_with_kwargs",
                     "_forward_hooks_always_called", "_forward_pre_hooks",
                     "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks"):
            hooks = getattr(m, name, None)
            if hooks is not None:
                memo[id(hooks)] = type(hooks)()
    return copy.deepcopy(model, memo)


def prompt_forward(body: nn.Module, prompts: Tensor, input_ids: Tensor,
                   attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
    """Soft prompts ``prompts`` (B, N, h), row b's prepended to row b -> hidden states of the
    input positions (B, n, h). ``token_type_ids`` (B, N + n) for a pair-aware body, or None."""
    B, N = prompts.shape[:2]
    embeds = body.get_input_embeddings()(input_ids)
    mask = torch.cat([attention_mask.new_ones(B, N), attention_mask], dim=1)
    seg = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
    out = body(inputs_embeds=torch.cat([prompts.to(embeds.dtype), embeds], dim=1),
               attention_mask=mask, use_cache=False, **seg)
    return out.last_hidden_state[:, N:]


def prefix_forward(body: nn.Module, key_values: Tensor, prefix_mask: Tensor, input_ids: Tensor,
                   attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
    """Prefix ``key_values`` (L, 2, B, kv_heads, N, head_dim) in the first N past slots of every
    layer; ``prefix_mask`` (B, N) is 0 on slots row b must not see (a shorter prefix, left-padded)
    -> hidden states of the input positions (B, n, h). ``token_type_ids``: (B, n) or None."""
    from transformers import DynamicCache

    from rapt.models import cache_kwargs

    B, n = input_ids.shape
    kv = key_values.to(body.get_input_embeddings().weight.dtype)
    cache = DynamicCache(config=body.config)
    for layer in range(kv.shape[0]):
        cache.update(kv[layer, 0], kv[layer, 1], layer)
    mask = torch.cat([prefix_mask.to(attention_mask.dtype), attention_mask], 1)
    # Explicit positions keep the real tokens at 0..n-1 whatever the prefix length (a cache
    # would otherwise shift them by N).
    pos = torch.arange(n, device=input_ids.device).unsqueeze(0).expand(B, n)
    seg = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
    out = body(input_ids=input_ids, attention_mask=mask, position_ids=pos, use_cache=False,
               **cache_kwargs(body, cache), **seg)
    return out.last_hidden_state


def _freeze(model: nn.Module) -> None:
    for p in model.parameters():
        p.requires_grad_(False)


class Tuner(nn.Module):
    """Common base: holds the (frozen, shared) backbone model without registering it as a child,
    so ``state_dict()`` / ``parameters()`` hold only what this tuner trains."""

    method: str = ""

    def __init__(self, backbone: Backbone) -> None:
        super().__init__()
        self._model = [backbone.model]  # a list hides it from nn.Module registration
        self.track_per_example = False
        self._per_example: list[tuple[nn.Parameter, Tensor]] = []
        self.sep_id = segment_sep_id(backbone)

    @property
    def model(self) -> nn.Module:
        return self._model[0]

    @property
    def body(self) -> nn.Module:
        return base_model(self.model)

    def per_example_tensors(self) -> list[tuple[nn.Parameter, Tensor]]:
        """Broadcast protocol: ``[(p, e)]`` with ``e`` of shape ``(B, *p.shape)`` from the last
        forward pass (needs ``track_per_example = True``); ``e.grad[b]`` is example b's gradient."""
        if not self.track_per_example:
            raise RuntimeError("set tuner.track_per_example = True before the forward pass")
        return list(self._per_example)

    def _broadcast(self, p: nn.Parameter, batch: int) -> Tensor:
        e = p.unsqueeze(0).expand(batch, *p.shape)
        if self.track_per_example and torch.is_grad_enabled() and p.requires_grad:
            e.retain_grad()
            self._per_example.append((p, e))
        return e

    def segments(self, input_ids: Tensor, attention_mask: Tensor, virtual: int = 0) -> dict:
        """``{"token_type_ids": (B, virtual + n)}`` for a body with token types (virtual prompt
        positions get type 0), else ``{}``."""
        if self.sep_id is None:
            return {}
        types = segment_ids(input_ids, attention_mask, self.sep_id)
        if virtual:
            types = torch.cat([types.new_zeros(types.shape[0], virtual), types], dim=1)
        return {"token_type_ids": types}

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        raise NotImplementedError


class PromptTuner(Tuner):
    """Lester et al.: N trainable vectors prepended to the input embeddings."""

    method = "prompt"

    def __init__(self, backbone: Backbone, num_virtual_tokens: int = 20, seed: int = 0) -> None:
        super().__init__(backbone)
        _freeze(backbone.model)
        emb = backbone.embeddings.detach()
        # Initialise from random non-special vocabulary embeddings (Lester et al. 2021 §3): it
        # starts the prompt on the embedding manifold, which trains faster than N(0, 1).
        g = torch.Generator().manual_seed(seed)
        allowed = torch.ones(emb.shape[0], dtype=torch.bool)
        allowed[[i for i in backbone.special_ids if i < emb.shape[0]]] = False
        pool = allowed.nonzero().squeeze(1)
        pick = pool[torch.randint(len(pool), (num_virtual_tokens,), generator=g)]
        self.prompt = nn.Parameter(emb[pick].clone().float())
        self.num_virtual_tokens = num_virtual_tokens

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        self._per_example = []
        B, N = input_ids.shape[0], self.num_virtual_tokens
        prompts = self._broadcast(self.prompt, B)
        return prompt_forward(self.body, prompts, input_ids, attention_mask,
                              **self.segments(input_ids, attention_mask, N))


class PrefixTuner(Tuner):
    """P-tuning v2 deep prompts: trainable key/value prefixes of length N in every layer.

    Without projection the parameter is ``prefix`` (N, L·2·kv_heads·head_dim). With projection
    (Li & Liang's reparametrisation) it is ``prefix_embedding`` (N, h) followed by a 2-layer MLP
    h -> proj_hidden -> L·2·kv; the MLP runs on the *broadcast* embedding (B, N, h) so its
    ``nn.Linear`` layers see per-example inputs (the DP engine's hooks need that).
    """

    method = "prefix"

    def __init__(self, backbone: Backbone, num_virtual_tokens: int = 20,
                 prefix_projection: bool = False, projection_hidden: int = 512,
                 seed: int = 0) -> None:
        super().__init__(backbone)
        _freeze(backbone.model)
        cfg = backbone.model.config
        self.num_layers = int(cfg.num_hidden_layers)
        self.num_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None)
                            or cfg.hidden_size // cfg.num_attention_heads)
        self.num_virtual_tokens = num_virtual_tokens
        self.prefix_projection = prefix_projection
        out_dim = self.num_layers * 2 * self.num_heads * self.head_dim
        g = torch.Generator().manual_seed(seed)
        if prefix_projection:
            h = int(cfg.hidden_size)
            self.prefix_embedding = nn.Parameter(torch.randn(num_virtual_tokens, h, generator=g))
            self.mlp = nn.Sequential(nn.Linear(h, projection_hidden), nn.Tanh(),
                                     nn.Linear(projection_hidden, out_dim))
        else:
            # Small init: prefix keys near 0 get uniform attention and values near 0 add little,
            # so training starts from (almost) the backbone's own function.
            self.prefix = nn.Parameter(0.02 * torch.randn(num_virtual_tokens, out_dim, generator=g))

    def key_values(self, batch: int) -> Tensor:
        """(L, 2, B, kv_heads, N, head_dim)."""
        if self.prefix_projection:
            flat = self.mlp(self._broadcast(self.prefix_embedding, batch))
        else:
            flat = self._broadcast(self.prefix, batch)
        kv = flat.view(batch, self.num_virtual_tokens, self.num_layers, 2, self.num_heads,
                       self.head_dim)
        return kv.permute(2, 3, 0, 4, 1, 5)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        self._per_example = []
        B = input_ids.shape[0]
        return prefix_forward(self.body, self.key_values(B),
                              attention_mask.new_ones(B, self.num_virtual_tokens), input_ids,
                              attention_mask, **self.segments(input_ids, attention_mask))


class _WholeModelTuner(Tuner):
    """LoRA and full fine-tuning train a private copy of the backbone (the shared one stays
    untouched, since the service reuses it across jobs)."""

    def __init__(self, backbone: Backbone) -> None:
        super().__init__(backbone)
        self.copy = copy_without_hooks(backbone.model)
        self._model = [self.copy]

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        self._per_example = []
        return self.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                         **self.segments(input_ids, attention_mask)).last_hidden_state

    def trainable_state(self) -> dict[str, Tensor]:
        return {k: v for k, v in self.state_dict().items()
                if k in {n for n, p in self.named_parameters() if p.requires_grad}}


LORA_ALPHA = 16


def attention_targets(model: nn.Module) -> list[str]:
    """The attention query and value projections' module names in ``model``'s family."""
    mtype = model.config.model_type
    return ["query", "value"] if mtype in {"bert", "roberta"} else ["q_proj", "v_proj"]


def add_lora(model: nn.Module, *, r: int, alpha: float,
             targets: Sequence[str] | str | None = None,
             dropout: float = 0.0, layers: Sequence[int] | None = None, wrap: bool = False,
             seed: int | None = None) -> nn.Module:
    """Fresh peft LoRA (B = 0: the model starts as it was) of rank ``r`` and scaling
    ``lora_scaling(r, alpha)`` on the ``targets`` modules (None: peft's choice for the model
    family; a string is peft's own, e.g. ``"all-linear"``: every linear layer but the output
    head) of ``layers`` (None: all); afterwards only the LoRA tensors of ``model`` train.

    ``wrap=False`` injects in place and returns ``model`` (parameter names unchanged);
    ``wrap=True`` returns peft's ``PeftModel`` around it (names under ``base_model.model.``;
    ``merge_and_unload`` folds the LoRA back into a plain model). ``seed``: draw the LoRA
    initialisation from this seed, leaving the global random state as it was; None: from the
    global random state."""
    from peft import LoraConfig, get_peft_model, inject_adapter_in_model

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                        target_modules=targets if targets is None or isinstance(targets, str)
                        else list(targets),
                        layers_to_transform=list(layers) if layers is not None else None)
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        if wrap:
            model = get_peft_model(model, config)
        else:
            inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def lora_scaling(r: int, alpha: float = LORA_ALPHA, rslora: bool = False) -> float:
    """The factor peft puts on B·A (``peft.tuners.lora.layer.LoraLayer.update_layer``)."""
    return alpha / (math.sqrt(r) if rslora else r)


class LoraTuner(_WholeModelTuner):
    """peft LoRA (scaling ``lora_scaling(r, alpha)``) on the attention query and value
    projections of a private copy of the backbone."""

    method = "lora"

    def __init__(self, backbone: Backbone, r: int = 8, alpha: int = LORA_ALPHA,
                 dropout: float = 0.0) -> None:
        super().__init__(backbone)
        add_lora(self.copy, r=r, alpha=alpha, targets=attention_targets(backbone.model),
                 dropout=dropout)


class FullTuner(_WholeModelTuner):
    method = "full"

    def __init__(self, backbone: Backbone) -> None:
        super().__init__(backbone)
        for p in self.copy.parameters():
            p.requires_grad_(True)
        # The input/output embeddings are tied in many causal LMs; training all of them is
        # what "full fine-tuning" means, so nothing is frozen here.


def build_tuner(backbone: Backbone, method: str, *, num_virtual_tokens: int = 20,
                prefix_projection: bool = False, lora_r: int = 8, seed: int = 0) -> Tuner:
    """Construct the tuner for ``method`` (one of ``METHODS``)."""
    if method == "prompt":
        return PromptTuner(backbone, num_virtual_tokens, seed=seed)
    if method == "prefix":
        return PrefixTuner(backbone, num_virtual_tokens, prefix_projection, seed=seed)
    if method == "lora":
        return LoraTuner(backbone, r=lora_r)
    if method == "full":
        return FullTuner(backbone)
    raise ValueError(f"unknown tuning method {method!r}; choose one of {', '.join(METHODS)}")
