"""One training loop that knows nothing of DP, in the manner of opacus and HF ``Trainer``.

The loop (:func:`run_loop`) asks a :class:`GradientStep` for the batches of an epoch and for the
gradients of one logical batch, then steps the optimizer and scheduler, keeps the history and
hands a :class:`TrainState` to the ``checkpoint`` callable. What a step does with a batch is its
own affair:

* :class:`MeanStep` backpropagates the batch mean of the per-example loss;
* :class:`DPStep` wraps :class:`rapt.dp.DPSGD`: Poisson batches, physical micro-batches,
  per-example clipping, Gaussian noise, ε in ``extra()``.

The per-example loss is a :class:`SummedLoss`: one forward pass, then a weighted sum of
objectives (:class:`TaskCE` here; each method's own beside it: RAPT's
:class:`rapt.tuning.reconstruction.Reconstruction`, the channel's
:class:`rapt.channel.denoiser.DenoisingObjective` and
:class:`rapt.channel.adapter.HiddenDistillation`), each with its own statistics, which the steps
average over the whole logical batch (under DP too, across micro-batches).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn

#: Format of :meth:`TrainState.state_dict`; version 1 is the trainer's flat dict before it
#: (``model``, ``optimizer``, ``scheduler``, ``torch_rng``, ``dp``, ``rec_vocab`` at the top).
STATE_FORMAT = 2

_FIELDS = {"kind", "method", "n_examples", "step", "epoch", "history", "meta", "rng",
           "components"}

StepStats = dict[str, float]
"""``{"loss": mean per-example loss, **objective stats}`` of one logical batch."""


# --------------------------------------------------------------------------- objectives


class ModelOutput(NamedTuple):
    """One forward pass: task logits (B, C), reconstruction logits (B, m, |T|) or None,
    hidden states (B, n, h)."""

    logits: Tensor
    rec: Tensor | None
    hidden: Tensor


class Objective(Protocol):
    """One summed term of the per-example loss."""

    weight: float

    def __call__(self, out: ModelOutput, idx: Tensor) -> tuple[Tensor, dict[str, Tensor]] | None:
        """-> (per-example loss (B,), stats tensors with examples first), or None when the
        term does not apply to this model (e.g. no reconstruction head)."""
        ...


@dataclass
class TaskCE:
    """Cross-entropy of the task head; ``labels`` (N,) is indexed by example."""

    labels: Tensor
    weight: float = 1.0

    def __call__(self, out: ModelOutput, idx: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        task = nn.functional.cross_entropy(out.logits.float(),
                                           self.labels[idx].to(out.logits.device),
                                           reduction="none")
        return task, {"task_loss": task.detach()}


class SummedLoss:
    """Example indices -> (per-example loss (B,), stats): one ``forward``, then
    Σ weight · objective over the objectives that apply."""

    def __init__(self, forward: Callable[[Tensor], ModelOutput],
                 objectives: Sequence[Objective]) -> None:
        self.forward = forward
        self.objectives = list(objectives)

    def __call__(self, idx: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        out = self.forward(idx)
        total: Tensor | None = None
        stats: dict[str, Tensor] = {}
        for obj in self.objectives:
            res = obj(out, idx)
            if res is None:
                continue
            term, s = res
            term = term if obj.weight == 1.0 else obj.weight * term
            total = term if total is None else total + term
            stats.update(s)
        if total is None:
            raise ValueError("no objective applies to this model")
        return total, stats


class _Meter:
    """Averages stats over every example of a logical batch (not just its last micro-batch)."""

    def __init__(self) -> None:
        self.parts: dict[str, list[Tensor]] = {}

    def add(self, stats: dict[str, Tensor]) -> None:
        for k, v in stats.items():
            self.parts.setdefault(k, []).append(v)

    def means(self) -> dict[str, float]:
        return {k: torch.cat(v).mean().item() for k, v in self.parts.items()}


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class Plan:
    """How many optimizer steps a run makes: ``epochs`` × ``steps_per_epoch``, capped at
    ``total_steps``."""

    epochs: int
    steps_per_epoch: int
    total_steps: int

    @classmethod
    def of_batches(cls, n_examples: int, batch_size: int, epochs: int) -> Plan:
        """Every example once an epoch in batches of ``batch_size`` (the last one may be
        short): ``ceil(n_examples / batch_size)`` steps an epoch."""
        per_epoch = math.ceil(n_examples / batch_size)
        return cls(epochs, per_epoch, per_epoch * epochs)


def shuffled_batches(n_examples: int, batch_size: int, seed: int, epoch: int) -> list[Tensor]:
    """Every example once, in batches of ``batch_size``: a permutation that depends only on
    ``seed`` and ``epoch``, so a resumed run skips exactly the batches it trained."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return list(torch.randperm(n_examples, generator=g).split(batch_size))


class GradientStep(Protocol):
    """Turns one logical batch into ``p.grad`` of the trainable parameters."""

    plan: Plan

    def batches(self, epoch: int, skip: int) -> Iterable[Tensor]:
        """Example-index batches of ``epoch``, less the first ``skip`` (already trained)."""
        ...

    def compute(self, idx: Tensor) -> StepStats:
        """Set ``p.grad`` for the batch ``idx``; -> its stats."""
        ...

    def extra(self) -> dict:
        """Fields added to every history record (e.g. ``{"epsilon": ...}``)."""
        ...

    def record(self) -> dict | None:
        """What the artifact must carry about the step's guarantee; None: no guarantee."""
        ...

    def components(self) -> dict[str, Any]:
        """The step's own checkpointed objects (``state_dict``/``load_state_dict``)."""
        ...

    def close(self) -> None:
        ...


class PlainStep:
    """What a step with no privacy guarantee and no checkpointed objects of its own answers
    besides ``batches`` and ``compute``."""

    def extra(self) -> dict:
        return {}

    def record(self) -> None:
        return None

    def components(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def length_split(idx: Tensor, lengths: Sequence[int]) -> list[Tensor]:
    """``idx`` as one or two groups of similar ``lengths[i]`` (the shorter rows, then the longer
    ones), split where the two pad to the fewest tokens (each group pads to its longest row).
    Two, not more: a third pass cost more than it saved (measured on the demo's prefix runs)."""
    order = sorted(idx.tolist(), key=lambda i: lengths[i])
    ls = [int(lengths[i]) for i in order]
    n = len(ls)
    # i = 0: one group; else the first i sorted rows, then the rest
    cut = min(range(n), key=lambda i: (i * ls[i - 1] if i else 0) + (n - i) * ls[-1])
    parts = [order[:cut], order[cut:]] if cut else [order]
    return [torch.as_tensor(p, dtype=idx.dtype) for p in parts]


class MeanStep(PlainStep):
    """Shuffled batches of ``batch_size`` (a fresh permutation per epoch from ``seed``); the
    gradient of the batch mean of ``loss_fn``.

    With ``lengths`` (tokens per example) a batch runs as one or two passes over rows of
    similar length (:func:`length_split`), their gradients summed: the same batches and the
    same mean gradient (up to float rounding), with less padding. A pass costs in proportion
    to its padded tokens, and random batches of short texts are much padding."""

    def __init__(self, loss_fn: SummedLoss, n_examples: int, batch_size: int, epochs: int,
                 seed: int, lengths: Sequence[int] | None = None) -> None:
        self.loss_fn = loss_fn
        self.n_examples, self.batch_size, self.seed = n_examples, batch_size, seed
        self.plan = Plan.of_batches(n_examples, batch_size, epochs)
        if lengths is not None and len(lengths) != n_examples:
            raise ValueError(f"lengths has {len(lengths)} entries for {n_examples} examples")
        self.lengths = lengths

    def batches(self, epoch: int, skip: int) -> list[Tensor]:
        return shuffled_batches(self.n_examples, self.batch_size, self.seed, epoch)[skip:]

    def compute(self, idx: Tensor) -> StepStats:
        parts = [idx] if self.lengths is None else length_split(idx, self.lengths)
        meter, total = _Meter(), 0.0
        for part in parts:
            loss, stats = self.loss_fn(part)
            (loss.sum() / len(idx)).backward()
            total += float(loss.detach().sum())
            meter.add(stats)
        return {"loss": total / len(idx), **meter.means()}


class DPStep:
    """DP-SGD through ``engine`` (a :class:`rapt.dp.DPSGD` over the trained module): Poisson
    logical batches split into micro-batches, summed per-example losses, clipping and noise.
    ``engine.planned_steps`` are spread over ``epochs``."""

    def __init__(self, loss_fn: SummedLoss, engine: Any, epochs: int) -> None:
        self.loss_fn, self.engine = loss_fn, engine
        total = int(engine.planned_steps)
        self.plan = Plan(epochs, max(1, math.ceil(total / epochs)), total)

    def batches(self, epoch: int, skip: int) -> Iterable[Tensor]:
        # Fresh Poisson batches: which examples a resumed run skips is not reproducible (the
        # sampling draws from the noise source), only how many steps are left.
        per = self.plan.steps_per_epoch
        left = min((epoch + 1) * per, self.plan.total_steps) - (epoch * per + skip)
        return self.engine.logical_batches(steps=max(0, left))

    def compute(self, idx: Tensor) -> StepStats:
        meter = _Meter()
        tot, cnt = 0.0, 0
        for mb in self.engine.micro_batches(idx):
            loss, stats = self.loss_fn(mb)
            loss.sum().backward()  # a sum, never a mean: the engine clips per example
            self.engine.accumulate()
            tot, cnt = tot + loss.detach().sum().item(), cnt + len(mb)
            meter.add(stats)
        self.engine.finalize()
        return {"loss": tot / max(1, cnt), **meter.means()}

    def extra(self) -> dict:
        return {"epsilon": self.engine.epsilon()}

    def record(self) -> dict:
        return self.engine.record()

    def components(self) -> dict[str, Any]:
        return {"dp": self.engine}  # the step count that ε is accounted over

    def close(self) -> None:
        self.engine.close()


# --------------------------------------------------------------------------- state


class TrainableTensors:
    """A module's trainable parameters as a checkpoint component, loaded strictly: the names
    must be exactly those that train now."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def names(self) -> set[str]:
        return {n for n, p in self.module.named_parameters() if p.requires_grad}

    def state_dict(self) -> dict[str, Tensor]:
        names = self.names()
        return {k: v.detach().clone() for k, v in self.module.state_dict().items() if k in names}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        names = self.names()
        missing, unexpected = sorted(names - set(state)), sorted(set(state) - names)
        if missing or unexpected:
            raise ValueError(f"checkpoint does not fit the model: missing {missing}, "
                             f"unexpected {unexpected}")
        self.module.load_state_dict(state, strict=False)  # the frozen rest is not saved


def upgrade_checkpoint(state: dict) -> dict:
    """A checkpoint in the current format; format 1 (the trainer's flat dict, which recorded
    neither method nor N) is converted, those two then unchecked. Raises ValueError otherwise."""
    if not isinstance(state, dict):
        raise ValueError(f"a checkpoint is a dict, not {type(state).__name__}")
    if "kind" in state:
        if int(state.get("format", 0)) > STATE_FORMAT:
            raise ValueError(f"checkpoint format {state['format']} is newer than this rapt "
                             f"reads ({STATE_FORMAT}); upgrade rapt to resume it")
        missing = sorted(_FIELDS - set(state))
        if missing:
            raise ValueError(f"checkpoint of kind {state['kind']!r} lacks {missing}")
        return state
    legacy = {"step", "model", "optimizer", "scheduler", "torch_rng"}
    if not legacy <= set(state):
        raise ValueError("not a rapt training checkpoint: no 'kind', and missing "
                         f"{sorted(legacy - set(state))} of the format-1 fields")
    comps = {k: state[k] for k in ("model", "optimizer", "scheduler", "dp")
             if state.get(k) is not None}
    return {"format": 1, "kind": "tune", "method": None, "n_examples": None,
            "step": int(state["step"]), "epoch": int(state.get("epoch", 0)),
            "history": list(state.get("history", [])),
            "meta": {"rec_vocab": state.get("rec_vocab")}, "rng": state["torch_rng"],
            "components": comps}


@dataclass
class TrainState:
    """Everything a run needs to resume exactly (bar privacy noise, see ``DPSGD.state_dict``).

    ``kind`` ("tune", "split-top", ...), ``method`` and ``n_examples`` must match on load;
    ``components`` are the objects with ``state_dict``/``load_state_dict`` (model tensors,
    optimizer, scheduler, DP engine); ``rng`` is the torch CPU generator (init, dropout; not
    noise), taken when saved; ``meta`` holds facts fixed at build time (the rec vocabulary).

    ``owns_rng=False`` is for a run that shares its process with other tenants' runs (the SAP
    provider's top in the service): the process's generator is not its own, so the state
    saves none (``rng`` None) and loading leaves the generator as it is, instead of setting
    every tenant's random stream to one tenant's saved one. Such a run must not draw from it
    (the top trains without dropout)."""

    kind: str
    method: str
    n_examples: int
    components: dict[str, Any]
    step: int = 0
    epoch: int = 0
    history: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    stopped: bool = False
    owns_rng: bool = True

    def state_dict(self) -> dict:
        return {"format": STATE_FORMAT, "kind": self.kind, "method": self.method,
                "n_examples": self.n_examples, "step": self.step, "epoch": self.epoch,
                "history": list(self.history), "meta": copy.deepcopy(self.meta),
                "rng": torch.get_rng_state() if self.owns_rng else None,
                # deep copies: state_dict()s hold live references that later steps mutate
                "components": {k: copy.deepcopy(c.state_dict())
                               for k, c in self.components.items()}}

    def load_state_dict(self, state: dict) -> None:
        state = upgrade_checkpoint(state)
        for key in ("kind", "method", "n_examples"):
            got, want = state[key], getattr(self, key)
            if got is not None and got != want:
                raise ValueError(f"checkpoint is for {key} {got!r}, this run has {want!r}")
        have, need = set(state["components"]), set(self.components)
        if have != need:
            raise ValueError(f"checkpoint holds {sorted(have)}, this run needs {sorted(need)}"
                             " (was it written with another DP setting?)")
        for k, c in self.components.items():
            c.load_state_dict(state["components"][k])
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.history = list(state["history"])
        self.meta = dict(state["meta"])
        if self.owns_rng and state["rng"] is not None:
            torch.set_rng_state(state["rng"])


# --------------------------------------------------------------------------- loop


def run_loop(step: GradientStep, optimizer: torch.optim.Optimizer, scheduler: Any,
             state: TrainState, *, progress: Callable[[dict], None] | None = None,
             should_stop: Callable[[], bool] | None = None,
             checkpoint: Callable[[TrainState], None] | None = None,
             checkpoint_every: int = 0) -> TrainState:
    """Train from ``state.step`` to ``step.plan.total_steps``; -> ``state`` (``stopped`` set
    when ``should_stop()`` ended it early).

    ``progress(record)`` after every optimizer step: ``{"step", "total_steps", "epoch", "loss",
    "lr", **stats, **step.extra()}``; ``checkpoint(state)`` every ``checkpoint_every`` steps,
    or at each epoch end when it is 0, and once more when ``should_stop()`` ends the run, so
    that a stopped run resumes where it stopped (Ctrl-C in `rapt tune`, a service shutdown)."""
    plan = step.plan
    state.stopped = False
    for epoch in range(state.step // plan.steps_per_epoch, plan.epochs):
        for idx in step.batches(epoch, state.step - epoch * plan.steps_per_epoch):
            if should_stop is not None and should_stop():
                state.stopped = True
                break
            stats = step.compute(idx)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state.step += 1
            rec = {"step": state.step, "total_steps": plan.total_steps, "epoch": epoch,
                   "loss": stats.pop("loss"), "lr": scheduler.get_last_lr()[0], **stats,
                   **step.extra()}
            state.history.append({k: v for k, v in rec.items() if k != "total_steps"})
            if progress is not None:
                progress(rec)
            if checkpoint is not None and checkpoint_every and \
                    state.step % checkpoint_every == 0:
                state.epoch = epoch
                checkpoint(state)
        if state.stopped:
            if checkpoint is not None and state.step > 0:
                state.epoch = epoch
                checkpoint(state)
            break
        if checkpoint is not None and not checkpoint_every:
            state.epoch = epoch + 1
            checkpoint(state)
    return state


def warmup_linear(total: int, warmup: int) -> Callable[[int], float]:
    """LR factor: linear warm-up over ``warmup`` steps, then linear decay to 0 at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def run_adamw(step: GradientStep, model: torch.nn.Module, kind: str, method: str,
              n_examples: int, *, lr: float, weight_decay: float = 0.0, warmup: float = 0.0,
              progress: Callable[[dict], None] | None = None,
              should_stop: Callable[[], bool] | None = None) -> TrainState:
    """:func:`run_loop` with AdamW over ``model``'s trainable parameters and a linear warm-up
    (``warmup``: share of the steps) then decay to 0: the plain regime of the provider's own
    models (denoiser, channel adapter), which never checkpoint; -> the final state."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    total = step.plan.total_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_linear(total, int(warmup * total)))
    state = TrainState(kind, method, n_examples,
                       {"model": TrainableTensors(model), "optimizer": opt, "scheduler": sched})
    run_loop(step, opt, sched, state, progress=progress, should_stop=should_stop)
    return state


__all__ = ["STATE_FORMAT", "DPStep", "GradientStep", "MeanStep", "ModelOutput", "Objective",
           "PlainStep", "Plan", "StepStats", "SummedLoss", "TaskCE", "TrainState",
           "TrainableTensors", "run_adamw", "run_loop", "shuffled_batches", "upgrade_checkpoint",
           "warmup_linear"]
