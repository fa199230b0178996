"""The provider's half of split training: the top model, its tuner and its optimizer."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from rapt.precision import autocast
from rapt.split.config import SplitConfig
from rapt.split.model import Top
from rapt.split.protocol import (
    ActivationGrad,
    Activations,
    OutputGrad,
    SplitProtocolError,
    TopOutput,
)
from rapt.training.loop import STATE_FORMAT, TrainableTensors, TrainState, warmup_linear

__all__ = ["ProviderSession", "load_top", "split_scheduler", "tune_top"]

STATE_KIND = "split-top"


def split_scheduler(optimizer: torch.optim.Optimizer, config: SplitConfig, total_steps: int
                    ) -> torch.optim.lr_scheduler.LambdaLR:
    """SAP §5.1's schedule (AdamW, linear): warm-up over ``config.warmup_ratio`` of the steps,
    then linear decay to 0, the training loop's :func:`rapt.training.loop.warmup_linear`;
    the provider's top and the customer's head and bottom both follow it."""
    warmup = int(config.warmup_ratio * total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear(total_steps, warmup))


def tune_top(top: Top, config: SplitConfig, init_embeddings: Tensor | None = None) -> None:
    """Make the top trainable the way ``config.method`` says (in place).

    "lora": peft LoRA (r, alpha) on the attention query/value projections of the top's blocks
    only (the bottom's blocks are the customer's and stay frozen). "prompt": ``top.prompt``
    (N, h), initialised from random rows of ``init_embeddings`` (seeded by ``config.seed``)."""
    if config.method == "lora":
        from rapt.tuning.tuners import add_lora, attention_targets

        # On the whole top, so its final norm is frozen too; only the blocks hold targets.
        add_lora(top, r=config.lora_r, alpha=config.lora_alpha,
                 targets=attention_targets(top.blocks), seed=config.seed)
    else:
        if init_embeddings is None:
            raise ValueError("prompt tuning the top needs init_embeddings (V, h)")
        g = torch.Generator().manual_seed(config.seed)
        pick = torch.randint(init_embeddings.shape[0], (config.num_virtual_tokens,), generator=g)
        top.add_prompt(config.num_virtual_tokens, init_embeddings[pick])
    top.eval()  # no dropout: a step is a deterministic function of the messages


class ProviderSession:
    """Runs the top for one customer's job: forward on received activations, update on the
    returned output gradient.

    The provider sees ``Activations`` (privatized representations and the padding mask) and
    ``OutputGrad`` (∂l/∂g); it never sees text, token ids, labels or the customer's output
    layer. One training step is in flight at a time: ``forward`` keeps the graph until the
    ``backward`` with the same step id arrives. ``n_examples``: the customer's training rows
    (the steps are planned over them; a resumed state must be of as many)."""

    def __init__(self, top: Top, config: SplitConfig, total_steps: int, n_examples: int
                 ) -> None:
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        self.top = top
        self.config = config
        self.total_steps = int(total_steps)
        self.n_examples = int(n_examples)
        self.hidden_size = int(top.blocks.config.hidden_size)
        params = [p for p in top.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the top has nothing to train: call tune_top(top, config) first")
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        self.scheduler = split_scheduler(self.optimizer, config, self.total_steps)
        self.step = 0  # optimizer steps taken
        self._pending: tuple[int, Tensor, Tensor] | None = None  # (step, input leaf, output)
        self._last_step = -1
        self._before_pending = -1  # _last_step before the pending forward (discard(rewind))

    def _device(self) -> torch.device:
        return next(iter(self.top.parameters())).device

    @property
    def pending_step(self) -> int | None:
        """Step id of the forward waiting for its OutputGrad (None when none is)."""
        return self._pending[0] if self._pending is not None else None

    def _check(self, acts: Activations) -> None:
        if not isinstance(acts, Activations):
            raise SplitProtocolError("Activations", "type",
                                     f"expected Activations, got {type(acts).__name__}")
        if acts.hidden.shape[-1] != self.hidden_size:
            raise SplitProtocolError("Activations", "hidden",
                                     f"last dimension is {acts.hidden.shape[-1]}, this top "
                                     f"expects {self.hidden_size}")

    def forward(self, acts: Activations, *, train: bool = True) -> TopOutput:
        """Top forward on a batch. ``train=False`` (inference) keeps no graph and needs no
        step order."""
        self._check(acts)
        dev = self._device()
        dtype = next(iter(self.top.parameters())).dtype
        if not train:
            with torch.no_grad(), autocast(self.config.precision, dev):
                g = self.top(acts.hidden.to(dev, dtype), acts.mask.to(dev).long())
            return TopOutput(acts.step, g.detach().float().cpu())
        if self._pending is not None:
            raise SplitProtocolError("Activations", "step",
                                     f"step {self._pending[0]} still waits for its OutputGrad")
        if acts.step <= self._last_step:
            raise SplitProtocolError("Activations", "step",
                                     f"step {acts.step} is not after step {self._last_step}")
        x = acts.hidden.detach().to(dev, dtype).requires_grad_(self.config.unfreeze_bottom)
        with autocast(self.config.precision, dev):
            g = self.top(x, acts.mask.to(dev).long())
        g = g.float()  # ∂l/∂g arrives in fp32; the cast back is in the graph
        self._pending = (acts.step, x, g)
        self._before_pending, self._last_step = self._last_step, acts.step
        return TopOutput(acts.step, g.detach().float().cpu())

    def backward(self, msg: OutputGrad) -> ActivationGrad | None:
        """Apply ∂l/∂g: backpropagate through the top, take one AdamW step. Returns the
        gradient at the top's input when the customer's bottom trains, else None.

        All or nothing: a gradient that overflows on the way (a finite but huge ``grad``,
        e.g. 3e38 in float32), or an update that leaves a parameter or the optimizer's
        moments non-finite, raises :class:`SplitProtocolError` with the top, optimizer,
        scheduler and step count as they were, and the forward still pending, so a correct
        ``OutputGrad`` for the same step can follow (after an undone update, the forward of
        that step first)."""
        if not isinstance(msg, OutputGrad):
            raise SplitProtocolError("OutputGrad", "type",
                                     f"expected OutputGrad, got {type(msg).__name__}")
        if self._pending is None:
            raise SplitProtocolError("OutputGrad", "step",
                                     f"step {msg.step}: no forward pass is waiting for it")
        step, x, g = self._pending
        if msg.step != step:
            raise SplitProtocolError("OutputGrad", "step",
                                     f"got step {msg.step}, the pending forward is step {step}")
        if tuple(msg.grad.shape) != tuple(g.shape):
            raise SplitProtocolError("OutputGrad", "grad",
                                     f"shape {tuple(msg.grad.shape)} != output shape "
                                     f"{tuple(g.shape)}")
        try:
            reply = self._backprop(step, x, g, msg.grad)
            self._update()
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            x.grad = None
        self._pending = None  # committed: the graph goes, the step counts
        self.step += 1
        return reply

    def _backprop(self, step: int, x: Tensor, g: Tensor, grad: Tensor
                  ) -> ActivationGrad | None:
        """Gradients into ``.grad`` (nothing else changes); refuses non-finite ones."""
        # retain_graph: after a refused gradient the forward stays usable for the retry
        g.backward(grad.to(g.device, g.dtype), retain_graph=True)
        if not all(p.grad is None or bool(torch.isfinite(p.grad).all())
                   for p in self._params()):
            raise SplitProtocolError("OutputGrad", "grad", "backpropagates to NaN or infinite "
                                     "gradients in the top (too large?); nothing was applied")
        if self.config.unfreeze_bottom:
            # ActivationGrad checks finiteness: an overflow at the top's input is refused here
            return ActivationGrad(step, x.grad.detach().float().cpu())
        return None

    def _update(self) -> None:
        """One optimizer and scheduler step, undone when it leaves a parameter or a moment
        non-finite (AdamW's squared gradient can overflow where the gradient did not). The
        undo rewrites the parameters the pending graph saved, so the forward is dropped too:
        the customer sends it again (the top is deterministic, g is the same)."""
        saved = (self.trainable_state(), copy.deepcopy(self.optimizer.state_dict()),
                 copy.deepcopy(self.scheduler.state_dict()))
        self.optimizer.step()
        self.scheduler.step()
        moments = [t for st in self.optimizer.state.values() for t in st.values()
                   if isinstance(t, Tensor) and t.is_floating_point()]
        if all(bool(torch.isfinite(t).all()) for t in self._params() + moments):
            return
        load_top(self.top, saved[0])
        self.optimizer.load_state_dict(saved[1])
        self.scheduler.load_state_dict(saved[2])
        self.discard(rewind=True)
        raise SplitProtocolError("OutputGrad", "grad", "the update would make the top's "
                                 "parameters or optimizer state NaN or infinite; nothing was "
                                 "applied (send the forward of this step again)")

    def _params(self) -> list[Tensor]:
        return [p for grp in self.optimizer.param_groups for p in grp["params"]]

    def discard(self, *, rewind: bool = False) -> None:
        """Drop a pending step (the customer gave up on it). ``rewind``: the same step id may be
        forwarded again (a retried request whose reply was lost); nothing was applied yet."""
        if rewind and self._pending is not None:
            self._last_step = self._before_pending
        self._pending = None

    def trainable_state(self) -> dict[str, Tensor]:
        names = {n for n, p in self.top.named_parameters() if p.requires_grad}
        return {k: v.detach().cpu().clone() for k, v in self.top.state_dict().items()
                if k in names}

    def _train_state(self) -> TrainState:
        """The session as the training loop's resumable state: the top's trainable tensors,
        optimizer, scheduler and message step ids; the split and the plan as facts to match.
        The process's random generator is not the session's (other tenants' sessions share
        it, and the top draws nothing from it)."""
        return TrainState(STATE_KIND, self.config.method, self.n_examples,
                          {"top": TrainableTensors(self.top), "optimizer": self.optimizer,
                           "scheduler": self.scheduler, "step_ids": _StepIds(self)},
                          step=self.step, owns_rng=False,
                          meta={"split_layer": self.config.split_layer,
                                "total_steps": self.total_steps})

    def state_dict(self) -> dict:
        """Everything to resume, in the training loop's format
        (:meth:`rapt.training.loop.TrainState.state_dict`, kind ``"split-top"``)."""
        return self._train_state().state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict` (or from the flat state that sessions saved before
        it); refuses a state of another kind, method, split, length or number of rows, and
        loads the top's tensors strictly. The process's random generator is left alone."""
        state = _current_format(state)
        kind = state.get("kind") if isinstance(state, dict) else type(state).__name__
        if kind != STATE_KIND:
            raise ValueError(f"not a provider session state (kind {kind!r}, "
                             f"expected {STATE_KIND!r})")
        for key, mine in (("split_layer", self.config.split_layer),
                          ("total_steps", self.total_steps)):
            got = state.get("meta", {}).get(key)
            if got != mine:
                raise ValueError(f"state has {key}={got!r}, this session {key}={mine!r}")
        train = self._train_state()
        train.load_state_dict(state)
        self.step = train.step
        self._pending = None


class _StepIds:
    """The session's message step ids as a checkpoint component: the last one trained (a new
    forward must come after it)."""

    def __init__(self, session: ProviderSession) -> None:
        self.session = session

    def state_dict(self) -> dict[str, int]:
        return {"last_step": self.session._last_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.session._last_step = int(state["last_step"])


def _current_format(state: dict) -> dict:
    """A provider state in the training loop's format. The flat state that sessions saved
    before it (``top``, ``optimizer``, ``scheduler``, ``step``, ``last_step`` at the top, no
    ``components``; it recorded no number of rows, which is then unchecked) is converted;
    anything else is returned as it is, for :meth:`TrainState.load_state_dict` to check."""
    if not isinstance(state, dict) or state.get("kind") != STATE_KIND or "components" in state:
        return state
    flat = {"top", "optimizer", "scheduler", "step", "method", "split_layer", "total_steps"}
    if not flat <= set(state):
        raise ValueError(f"provider session state lacks {sorted(flat - set(state))}")
    return {"format": STATE_FORMAT, "kind": STATE_KIND, "method": state["method"],
            "n_examples": None, "step": int(state["step"]), "epoch": 0, "history": [],
            "meta": {"split_layer": state["split_layer"], "total_steps": state["total_steps"]},
            "rng": None,
            "components": {"top": state["top"], "optimizer": state["optimizer"],
                           "scheduler": state["scheduler"],
                           "step_ids": {"last_step": int(state.get("last_step", -1))}}}


def load_top(top: nn.Module, tensors: dict[str, Tensor]) -> None:
    """Load the trainable tensors of a tuned top; every trainable name must be present and
    nothing else may be."""
    names = {n for n, p in top.named_parameters() if p.requires_grad}
    missing, extra = names - set(tensors), set(tensors) - names
    if missing or extra:
        raise ValueError(f"top tensors do not fit: missing {sorted(missing)}, unexpected "
                         f"{sorted(extra)}")
    with torch.no_grad():
        params = dict(top.named_parameters())
        for k, v in tensors.items():
            if params[k].shape != v.shape:
                raise ValueError(f"top tensor {k}: shape {tuple(v.shape)} != "
                                 f"{tuple(params[k].shape)}")
            params[k].copy_(v)


