"""PromptDPSGD engine: per-example clipping and Gaussian noise on the trainable parameters only.

Per-example gradients come without a second backward pass and without a per-sample-gradient
engine over the backbone:

* prompt / prefix parameters: through the *broadcast protocol* (docs/ARCHITECTURE.md). A module
  with ``per_example_tensors()`` returns ``[(p, e)]`` where ``e`` (B, *p.shape) is ``p`` expanded
  over the batch in the forward pass, with ``e.retain_grad()``. After ``loss.sum().backward()``
  ``e.grad[b]`` is example b's gradient of ``p`` (the expand's backward would just sum it).
* trainable ``nn.Linear`` layers (task head, RAPT reconstruction head): forward hooks keep the
  input activation a (B, [T,] in) and a tensor hook on the output keeps its gradient g; example
  b's gradients are ``Σ_t g[b,t]ᵀ a[b,t]`` (weight) and ``Σ_t g[b,t]`` (bias).

Any other trainable parameter has no per-example path and is refused (privacy code must not
silently fall back to batch gradients).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from rapt.dp.accounting import check_noise_multiplier, find_noise_multiplier
from rapt.dp.accounting import epsilon as _epsilon
from rapt.dp.config import DPConfig, check_n_examples
from rapt.dp.sampling import micro_batches, poisson_batch, poisson_batches
from rapt.noise import NoiseSource

_NORM_EPS = 1e-6  # same guard as opacus: clip factor C / (‖g‖ + 1e-6) keeps ‖clipped‖ < C


class DPSGD:
    """DP-SGD gradient privatizer for prompt/prefix tuning (Flocks Alg. 1).

    Usage, per logical batch::

        for idx in dp.logical_batches():            # Poisson(q) batches, possibly empty
            for mb in dp.micro_batches(idx):        # ≤ physical_batch_size examples
                per_example_loss(mb).sum().backward()   # SUM over examples, never mean
                dp.accumulate()                     # clip each example to C, add to the sum
            dp.finalize()                           # + N(0, σ²C²), / (q·N) -> p.grad
            optimizer.step(); optimizer.zero_grad()

    ``model`` is the module holding every trainable parameter (tuner + heads); parameters with
    ``requires_grad=False`` (the frozen backbone) are ignored. ``steps`` is the planned number of
    logical steps (used to calibrate σ when ``config.target_epsilon`` is set). ``batch_size`` is
    the logical batch size used to derive q = batch_size / N when ``config.sample_rate`` is None.
    ``seed`` makes sampling and noise repeatable (tests, benchmarks; ``record()["seeded"]`` says
    so); leave it None in real use: both then come from the OS CSPRNG, since whoever knows the
    seed knows the noise, which voids the guarantee.
    """

    def __init__(
        self, model: nn.Module, config: DPConfig, n_examples: int, steps: int, *,
        batch_size: int | None = None, seed: int | None = None,
    ) -> None:
        if not isinstance(config, DPConfig):
            raise TypeError(f"config must be a rapt.dp.DPConfig (got {type(config).__name__})")
        self.config = config
        self.n_examples = check_n_examples(n_examples)
        if int(steps) < 1:
            raise ValueError(f"PromptDPSGD needs ≥ 1 planned step (got {steps})")
        self.planned_steps = int(steps)
        self.sample_rate = config.resolve_sample_rate(self.n_examples, batch_size)
        self.delta = config.resolve_delta(self.n_examples)
        self.max_grad_norm = float(config.max_grad_norm)
        self.physical_batch_size = int(config.physical_batch_size)
        self.accountant = config.accountant
        if config.noise_multiplier is not None:
            self.noise_multiplier = float(config.noise_multiplier)
            # Now, not at the first report: a σ whose ε over the planned steps is above ε_max,
            # or a δ too large for the accountant, is refused before any step.
            check_noise_multiplier(self.noise_multiplier, self.sample_rate,
                                   self.planned_steps, self.delta, self.accountant)
        else:
            self.noise_multiplier = find_noise_multiplier(
                float(config.target_epsilon), self.delta, self.sample_rate, self.planned_steps,
                accountant=self.accountant,
            )
        self.expected_batch_size = self.sample_rate * self.n_examples
        self.steps = 0
        self.examples_seen = 0
        self.last_norms: torch.Tensor | None = None  # pre-clip per-example norms, last micro-batch

        self.model = model
        self._names: dict[int, str] = {}
        self.params: list[nn.Parameter] = []
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in self._names:
                self._names[id(p)] = name
                self.params.append(p)
        if not self.params:
            raise ValueError("PromptDPSGD: the model has no trainable parameters")
        self._broadcasters = [
            m for m in model.modules() if callable(getattr(m, "per_example_tensors", None))
        ]
        for m in self._broadcasters:
            # rapt.tuning.tuners records the copies only on request
            if hasattr(m, "track_per_example"):
                m.track_per_example = True
        self._linears = [
            (n, m) for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and any(p.requires_grad for p in m.parameters(False))
        ]
        covered = {id(p) for m in self._broadcasters for p in m.parameters()}
        covered |= {id(p) for _, m in self._linears for p in m.parameters(False)}
        missing = [self._names[id(p)] for p in self.params if id(p) not in covered]
        if missing:
            raise ValueError(
                "PromptDPSGD has no per-example gradient path for trainable parameter(s) "
                f"{', '.join(missing)}: only prompt/prefix parameters exposed through "
                "per_example_tensors() and nn.Linear layers are supported; freeze the others"
            )
        self._records: dict[nn.Module, list[list]] = {m: [] for _, m in self._linears}
        self._hooks = [m.register_forward_hook(self._linear_forward_hook) for _, m in self._linears]

        self.noise = NoiseSource(seed)
        self.seeded = self.noise.seeded
        self._sums: dict[int, torch.Tensor] = {}
        self._eps_cache: dict[tuple[int, float], float] = {}

    # ---------------------------------------------------------------- sampling
    def logical_batches(
        self, noise: NoiseSource | None = None, steps: int | None = None
    ) -> Iterator[torch.Tensor]:
        """Poisson(q) index batches (LongTensor, may be empty) for the remaining planned steps.

        The sampling is part of the mechanism (amplification by subsampling assumes the batch
        is secret), so it draws from the engine's noise source unless one is passed. A seeded
        engine draws step t's batch from the sub-stream ("batch", t): a run resumed at step k
        gets the batches an uninterrupted run would have drawn for steps k+1.., never a replay
        of steps 1..k."""
        n = max(0, self.planned_steps - self.steps if steps is None else int(steps))
        if noise is not None:
            return poisson_batches(self.n_examples, self.sample_rate, n, noise)
        return self._step_batches(self.steps, n)

    def _step_batches(self, first: int, n: int) -> Iterator[torch.Tensor]:
        for t in range(first, first + n):
            yield poisson_batch(self.n_examples, self.sample_rate, self.noise.derive("batch", t))

    def micro_batches(self, indices: torch.Tensor) -> list[torch.Tensor]:
        """Split a logical batch into physical micro-batches (empty list for an empty batch)."""
        return micro_batches(indices, self.physical_batch_size)

    # ---------------------------------------------------------------- per-example gradients
    def _linear_forward_hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if not torch.is_grad_enabled() or not isinstance(output, torch.Tensor) \
                or not output.requires_grad:
            return
        rec: list = [inputs[0].detach(), None]
        self._records[module].append(rec)

        def keep_grad(g: torch.Tensor, rec: list = rec) -> None:
            rec[1] = g.detach()

        output.register_hook(keep_grad)

    def per_example_gradients(self) -> dict[str, torch.Tensor]:
        """Example-wise gradients {parameter name: (B, *shape)} of the last backward pass."""
        return {self._names[k]: v for k, v in self._collect().items()}

    def _collect(self) -> dict[int, torch.Tensor]:
        grads: dict[int, torch.Tensor] = {}
        sizes: dict[str, int] = {}

        def add(p: torch.Tensor, g: torch.Tensor, source: str) -> None:
            sizes[source] = g.shape[0]
            grads[id(p)] = grads[id(p)] + g if id(p) in grads else g

        for m in self._broadcasters:
            for p, e in m.per_example_tensors():
                if id(p) not in self._names:
                    if isinstance(p, nn.Parameter) and not p.requires_grad:
                        continue
                    raise RuntimeError(
                        f"{type(m).__name__}.per_example_tensors() returned a tensor that is not "
                        "a trainable parameter of the model given to DPSGD (a projected prefix "
                        "is not supported: use prefix_projection=False under DP)"
                    )
                name = self._names[id(p)]
                if e.grad is None:
                    raise RuntimeError(
                        f"no gradient on the broadcast copy of {name}: call accumulate() after "
                        "loss.sum().backward(), and the tuner must call e.retain_grad()"
                    )
                if tuple(e.grad.shape[1:]) != tuple(p.shape):
                    raise RuntimeError(
                        f"broadcast copy of {name} has shape {tuple(e.grad.shape)}, expected "
                        f"(B, {', '.join(map(str, p.shape))})"
                    )
                add(p, e.grad.detach(), name)
        for lname, m in self._linears:
            for a, g in self._records[m]:
                if g is None:
                    continue  # a forward without backward (e.g. evaluation with grad on)
                b = a.shape[0]
                # Under bf16 autocast (rapt.precision) a layer's input and output gradient
                # may be bfloat16: per-example gradients, norms and clipping stay float32.
                a, g = a.float(), g.float()
                if a.dim() == 2:
                    gw = torch.einsum("bo,bi->boi", g, a)
                    gb = g
                else:  # (B, T..., in): the layer is shared over positions, sum them per example
                    a3, g3 = a.reshape(b, -1, a.shape[-1]), g.reshape(b, -1, g.shape[-1])
                    gw = torch.einsum("bto,bti->boi", g3, a3)
                    gb = g3.sum(1)
                if m.weight.requires_grad:
                    add(m.weight, gw, lname or "linear")
                if m.bias is not None and m.bias.requires_grad:
                    add(m.bias, gb, lname or "linear")
        if not sizes:
            raise RuntimeError("no per-example gradients: run loss.sum().backward() on a "
                               "micro-batch before accumulate()")
        if len(set(sizes.values())) != 1:
            raise RuntimeError(
                "per-example gradients disagree on the batch size "
                f"({sizes}); a trainable layer ran outside the per-example batch (e.g. a prefix "
                "projection) or ran more than once per micro-batch"
            )
        missing = [self._names[id(p)] for p in self.params if id(p) not in grads]
        if missing:
            raise RuntimeError(f"no per-example gradient reached {', '.join(missing)} in this "
                               "backward pass; freeze parameters that the loss does not use")
        return grads

    def _clear(self) -> None:
        for recs in self._records.values():
            recs.clear()
        for m in self._broadcasters:
            for _, e in m.per_example_tensors():
                e.grad = None
        for p in self.params:
            p.grad = None

    # ---------------------------------------------------------------- DP-SGD step
    def accumulate(self) -> None:
        """Clip each example's full gradient (all trainable parameters jointly) to C and add it
        to the running sum of this logical batch. Call after ``loss.sum().backward()``."""
        grads = self._collect()
        b = next(iter(grads.values())).shape[0]
        sq = torch.zeros(b, dtype=torch.float32, device=self.params[0].device)
        for g in grads.values():
            sq = sq + g.reshape(b, -1).float().pow(2).sum(1)
        norms = sq.sqrt()
        factor = (self.max_grad_norm / (norms + _NORM_EPS)).clamp(max=1.0)
        for p in self.params:
            g = grads[id(p)]
            s = torch.tensordot(factor.to(g.dtype), g, dims=1).to(p.dtype)
            self._sums[id(p)] = self._sums[id(p)] + s if id(p) in self._sums else s
        self.last_norms = norms.detach()
        self.examples_seen += b
        self._clear()

    def finalize(self) -> None:
        """Add N(0, σ²C²) to the clipped sum, divide by the expected batch size q·N and write
        it into ``p.grad``. Call once per logical batch, also when the batch was empty.

        With a target ε, σ was calibrated for ``planned_steps``: a further step would spend more
        than the target, so it is refused."""
        if self.config.target_epsilon is not None and self.steps >= self.planned_steps:
            raise RuntimeError(
                f"privacy budget spent: σ was calibrated for ε = {self.config.target_epsilon} "
                f"over {self.planned_steps} steps; plan more steps before training"
            )
        std = self.noise_multiplier * self.max_grad_norm
        # Seeded: step t's noise is the sub-stream ("noise", t), so resuming at step k neither
        # replays steps 1..k nor depends on how many draws happened before (see NoiseSource).
        noise = self.noise.derive("noise", self.steps)
        for p in self.params:
            s = self._sums.pop(id(p), None)
            g = torch.zeros_like(p) if s is None else s
            if std > 0:
                # secure: opacus's sum-of-draws defence against floating-point attacks
                g = g + noise.normal(tuple(p.shape), std=std, device=p.device, dtype=p.dtype,
                                     secure=True)
            # Dividing by the expected (not the realized) batch size keeps the batch size
            # itself out of the released gradient, as the Poisson analysis assumes.
            p.grad = g / self.expected_batch_size
        self._sums.clear()
        self.steps += 1

    # ---------------------------------------------------------------- accounting
    def epsilon(self, delta: float | None = None) -> float:
        """ε spent so far at δ (default: the configured δ, ``DPConfig.resolve_delta``)."""
        d = self.delta if delta is None else float(delta)
        key = (self.steps, d)
        if key not in self._eps_cache:
            self._eps_cache[key] = _epsilon(self.noise_multiplier, self.sample_rate, self.steps,
                                            d, self.accountant)
        return self._eps_cache[key]

    def record(self) -> dict:
        """What a saved prompt must carry about its guarantee."""
        return {
            "mechanism": "PromptDPSGD (Poisson sampling, per-example clipping, Gaussian noise)",
            "epsilon": self.epsilon(),
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "planned_steps": self.planned_steps,
            "accountant": self.accountant,
            "target_epsilon": self.config.target_epsilon,
            "n_examples": self.n_examples,
            "expected_batch_size": self.expected_batch_size,
            "physical_batch_size": self.physical_batch_size,
            "trainable_parameters": [self._names[id(p)] for p in self.params],
            "seeded": self.seeded,
        }

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """Step count only: a generator state would reveal the noise already added, so a
        resumed run draws fresh sampling and noise (the accountant needs only the steps). A
        seeded engine needs no generator state either: its step-t draws are derived from
        (seed, t), so loading the step count is what moves it past the steps already taken."""
        return {"steps": self.steps, "examples_seen": self.examples_seen,
                "noise_multiplier": self.noise_multiplier}

    def load_state_dict(self, state: dict) -> None:
        if abs(float(state["noise_multiplier"]) - self.noise_multiplier) > 1e-12:
            raise ValueError("DPSGD checkpoint was made with a different noise multiplier")
        self.steps = int(state["steps"])
        self.examples_seen = int(state["examples_seen"])

    def close(self) -> None:
        """Remove the hooks from the model."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
