"""The customer's half of split training, and the in-process driver.

The customer holds the text, the labels, the bottom model, the privatizer, the contributing
tokens (CTI) and its own output layer (a linear map from the top's output g to the classes):
the loss is computed here (SAP Algorithm 1 lines 23-26), so the labels, their names and the
output layer never cross. The labels still shape what crosses back: ∂l/∂g = Wᵀ(p − e_y)/B,
so each batch's gradients span C − 1 dimensions (the provider learns the number of classes C)
and rows of one class point into one cone (clustering them recovers which rows share a label:
100 % purity on Financial PhraseBank within the first epoch, and a few known labels name the
clusters; :mod:`rapt.attacks.label_inference`). ``SplitConfig.label_dp_epsilon`` trains on
randomized-response labels instead, which bounds what the provider learns about each label by
ε-label-DP (it still learns C).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from rapt.models import Backbone
from rapt.noise import NoiseSource
from rapt.precision import autocast
from rapt.privacy.cti import CTIResult, contributing_tokens, privatize_with_scale
from rapt.privacy.mechanism import Privatizer, candidate_ids_from_tokenizer, sample_noise
from rapt.split.config import SplitConfig
from rapt.split.model import Bottom, split_backbone
from rapt.split.protocol import (
    ActivationGrad,
    Activations,
    OutputGrad,
    Release,
    SplitProtocolError,
    TopOutput,
)
from rapt.split.provider import ProviderSession, split_scheduler, tune_top
from rapt.training.loop import (
    PlainStep,
    Plan,
    StepStats,
    TrainState,
    run_loop,
    shuffled_batches,
)

__all__ = ["SplitCustomer", "SplitStep", "encode_texts", "make_customer", "predict_split",
           "setup_split", "total_steps", "train_split"]


def total_steps(n_examples: int, config: SplitConfig) -> int:
    return Plan.of_batches(n_examples, config.batch_size, config.epochs).total_steps


def encode_texts(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids with the tokenizer's special tokens, truncated to ``max_length``."""
    enc = tokenizer(list(texts), add_special_tokens=True, truncation=True, max_length=max_length)
    rows = [list(r) for r in enc["input_ids"]]
    for i, r in enumerate(rows):
        if not r:
            raise ValueError(f"text {i} encodes to no tokens")
    return rows


def _pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


class SplitCustomer:
    """Privatizes, runs the bottom, keeps the labels and computes the loss.

    ``privatizer`` (None = no privatization) works over the backbone's *initial* (public)
    embedding matrix and draws its noise from its own NoiseSource (OS entropy unless it was
    built with a seed). With ``config.privatize == "output"`` there is no privatizer: the
    bottom's output states get dχ noise at ``config.eta`` from a NoiseSource seeded only by
    ``config.noise_seed``. With ``config.cti`` call :meth:`fit_cti` on the training rows first.
    """

    def __init__(self, bottom: Bottom, config: SplitConfig, num_labels: int, *,
                 hidden_size: int, pad_id: int, special_ids: Sequence[int] = (),
                 privatizer: Privatizer | None = None) -> None:
        if num_labels < 2:
            raise ValueError(f"num_labels must be >= 2, got {num_labels}")
        tokens = config.privatize == "tokens"
        if (privatizer is None) != (config.eta is None or not tokens):
            raise ValueError("pass a privatizer exactly when config.eta is set and "
                             "config.privatize is 'tokens'")
        self.bottom = bottom
        self.config = config
        self.num_labels = int(num_labels)
        self.pad_id = int(pad_id)
        self.special_ids = sorted({int(i) for i in special_ids} | {self.pad_id})
        self.privatizer = privatizer
        # output mode: the noise on the bottom's states (token mode: the privatizer's own)
        self.output_noise = (NoiseSource(config.noise_seed)
                             if config.eta is not None and not tokens else None)
        self.cti: CTIResult | None = None
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.head = nn.Linear(hidden_size, num_labels)
        # One AdamW over the customer's trainables: the head, and the bottom when it trains,
        # each group at its own learning rate; one schedule (set by load) over both.
        groups = [{"params": list(self.head.parameters()), "lr": config.head_lr or config.lr}]
        if config.unfreeze_bottom:
            for p in bottom.parameters():
                p.requires_grad_(True)
            groups.append({"params": list(bottom.parameters()),
                           "lr": config.bottom_lr or config.lr})
        self.optimizer = torch.optim.AdamW(groups, weight_decay=config.weight_decay)
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self._rows: list[list[int]] = []
        self._labels: Tensor = torch.zeros(0, dtype=torch.long)
        self._cache_ids: list[Tensor] | None = None
        self._cache_hidden: list[Tensor] | None = None
        self._pending: tuple[int, list[int], Tensor | None] | None = None
        self.replaced = 0  # privatized tokens that changed, over all releases
        self.perturbable = 0  # tokens that went through the mechanism or CTI

    # ------------------------------------------------------------------ privatization

    def fit_cti(self, rows: Sequence[Sequence[int]], labels: Sequence[int]) -> CTIResult:
        """Contributing tokens from the customer's private labelled rows (SAP §4.4)."""
        vocab = int(self.bottom.word_embeddings.weight.shape[0])
        self.cti = contributing_tokens(rows, labels, num_classes=self.num_labels,
                                       vocab_size=vocab, special_ids=self.special_ids,
                                       coverage=self.config.cti_coverage,
                                       rule=self.config.cti_rule,
                                       smoothing=self.config.cti_smoothing)
        return self.cti

    def privatize(self, ids: Tensor) -> Tensor:
        """Privatized ids, same shape; specials (padding included) pass through. With CTI the
        contributing tokens get η·multiplier (``inf``: they pass through unchanged)."""
        if self.privatizer is None:
            return ids.clone()
        if self.config.cti and self.cti is None:
            raise RuntimeError("config.cti is set: call fit_cti(rows, labels) first")
        scale = None
        if self.cti is not None and self.config.cti:
            scale = self.cti.eta_scale(ids, self.config.cti_multiplier)
        out = privatize_with_scale(self.privatizer, ids, scale)
        counted = ~torch.isin(ids, torch.tensor(self.special_ids, dtype=torch.long))
        self.perturbable += int(counted.sum())
        self.replaced += int((out != ids)[counted].sum())
        return out

    @property
    def measured_p(self) -> float:
        """Fraction of released non-special tokens that the mechanism replaced (0 with
        ``privatize="output"``: no token is replaced there, the noise is on the states)."""
        return self.replaced / self.perturbable if self.perturbable else 0.0

    def privacy_report(self, rows: Sequence[Sequence[int]], *,
                       target_p: float | None = None) -> dict | None:
        """η, P and the nearest-neighbour inversion success of the privatized tokens behind
        the release of ``rows`` (:func:`rapt.privacy.mechanism.privacy_report`; what split 0 hands
        over, deeper splits add the bottom's blocks on top): a frozen bottom's one release, or
        for an unfrozen one a fresh draw made for the measurement only (every step draws its
        own). None without privatization, and with ``privatize="output"``, where no token is
        privatized (the inversion attacks of :mod:`rapt.attacks.split_inversion` measure that
        release)."""
        from rapt.privacy.mechanism import privacy_report

        if self.privatizer is None:
            return None
        if not self.config.unfreeze_bottom and self._cache_ids is not None:
            released = [t.tolist() for t in self._cache_ids]
        else:
            ids, _ = _pad(rows, self.pad_id)
            scale = (self.cti.eta_scale(ids, self.config.cti_multiplier)
                     if self.cti is not None and self.config.cti else None)
            priv = privatize_with_scale(self.privatizer, ids, scale)
            released = [priv[i, :len(r)].tolist() for i, r in enumerate(rows)]
        return privacy_report([list(r) for r in rows], released, self.privatizer,
                              target_p=target_p)

    # ------------------------------------------------------------------ data

    @property
    def num_examples(self) -> int:
        return len(self._rows)

    def load(self, rows: Sequence[Sequence[int]], labels: Sequence[int], *,
             total: int | None = None) -> None:
        """Keep the training rows and labels here. A frozen bottom privatizes and encodes them
        once now (SAP §4.2); an unfrozen one does it afresh for every batch."""
        if len(rows) != len(labels) or not rows:
            raise ValueError(f"need as many labels as rows, at least one ({len(rows)} rows, "
                             f"{len(labels)} labels)")
        for i, y in enumerate(labels):
            if not 0 <= int(y) < self.num_labels:
                raise ValueError(f"label of row {i} is {y}, outside 0..{self.num_labels - 1}")
        self._rows = [list(r) for r in rows]
        self._labels = torch.as_tensor([int(y) for y in labels], dtype=torch.long)
        if self.config.label_dp_epsilon is not None:
            from rapt.dp.label_dp import randomized_response

            # drawn once: every epoch trains on the same randomized labels (post-processing)
            self._labels = randomized_response(
                self._labels, self.num_labels, self.config.label_dp_epsilon,
                NoiseSource(self.config.noise_seed).derive("label-dp"))
        self.scheduler = split_scheduler(self.optimizer, self.config,
                                         total or total_steps(len(rows), self.config))
        if self.config.unfreeze_bottom:
            return
        ids, _ = _pad(self._rows, self.pad_id)
        priv = self.privatize(ids)
        self._encode_cache([priv[i, :len(r)] for i, r in enumerate(self._rows)])

    def _encode_cache(self, released: list[Tensor],
                      hidden: list[Tensor] | None = None) -> None:
        """Keep the frozen bottom's one release: the released ids and, with blocks, their
        states (``hidden``: states already released, restored on resume instead of drawing
        output noise a second time)."""
        self._cache_ids = released
        self._cache_hidden = hidden
        if hidden is None and self.bottom.num_blocks:
            self._cache_hidden = []
            with torch.no_grad():
                for s in range(0, len(released), 64):
                    chunk = released[s:s + 64]
                    h = self._run_bottom(*_pad(chunk, self.pad_id))
                    self._cache_hidden += [h[i, :len(c)].clone() for i, c in enumerate(chunk)]

    def _device(self) -> torch.device:
        return self.bottom.word_embeddings.weight.device

    def _run_bottom(self, ids: Tensor, mask: Tensor) -> Tensor:
        """What the bottom releases for ``ids`` (B, n): its states, with output noise in
        ``privatize="output"`` mode (fresh on every call), padding zeroed."""
        dev = self._device()
        mask = mask.to(dev)
        with autocast(self.config.precision, dev):
            h = self.bottom(ids.to(dev), mask)
        h = h.float()  # output noise and the release are fp32 whatever the bottom ran in
        if self.output_noise is not None:
            valid = mask.bool()
            z = sample_noise(int(valid.sum()), h.shape[-1], float(self.config.eta),
                             self.output_noise, device=dev)
            h = h + torch.zeros_like(h).masked_scatter(valid.unsqueeze(-1), z.to(h.dtype))
            self.perturbable += int(valid.sum())
        # Padding positions are zeroed before release: after a block they attend to the real
        # tokens, so their states would be extra views of the private row.
        return h * mask.unsqueeze(-1).to(h.dtype)

    # ------------------------------------------------------------------ protocol

    def release(self, idx: Sequence[int], step: int) -> Activations:
        """Activations for training rows ``idx`` (the message for step ``step``)."""
        idx = [int(i) for i in idx]
        if self.config.unfreeze_bottom:
            ids, mask = _pad([self._rows[i] for i in idx], self.pad_id)
            h = self._run_bottom(self.privatize(ids), mask)
            self._pending = (step, idx, h)
            return Activations(step, h.detach().float().cpu(), mask)
        assert self._cache_ids is not None, "call load(rows, labels) first"
        ids, mask = _pad([self._cache_ids[i] for i in idx], self.pad_id)
        if self._cache_hidden is not None:
            n, d = ids.shape[1], self._cache_hidden[0].shape[-1]
            h = torch.zeros(len(idx), n, d)
            for j, i in enumerate(idx):
                h[j, :len(self._cache_hidden[i])] = self._cache_hidden[i]
        else:
            with torch.no_grad():
                h = self._run_bottom(ids, mask)
        self._pending = (step, idx, None)
        return Activations(step, h.detach().float().cpu(), mask)

    @property
    def pending_rows(self) -> list[int] | None:
        """Training rows of the release waiting for its TopOutput (None when none is)."""
        return list(self._pending[1]) if self._pending is not None else None

    @torch.no_grad()
    def frozen_release(self, start: int, stop: int) -> Release:
        """Rows ``start:stop`` of the frozen bottom's one release (made by :meth:`load`), the
        same values :meth:`release` sends: what a remote provider receives once, up front."""
        if self.config.unfreeze_bottom:
            raise ValueError("an unfrozen bottom privatizes afresh every step: there is no "
                             "one release to upload")
        assert self._cache_ids is not None, "call load(rows, labels) first"
        rows = self._cache_ids[start:stop]
        if self._cache_hidden is not None:
            parts = self._cache_hidden[start:stop]
        else:
            h = self._run_bottom(*_pad(rows, self.pad_id))
            parts = [h[i, :len(r)] for i, r in enumerate(rows)]
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.int32)
        return Release(start, torch.cat(parts).float().cpu(), lengths)

    def loss_grad(self, out: TopOutput) -> tuple[OutputGrad, dict]:
        """The customer's loss on the top's output: CE(head(g), y); returns ∂l/∂g for the
        provider and, with a frozen bottom (the step is then complete), updates the head."""
        grad, stats = self.output_grad(out)
        if self._pending is None:
            self._update()
        return grad, stats

    def apply(self, msg: ActivationGrad) -> None:
        """Unfrozen bottom: backpropagate the provider's input gradient and update."""
        self.input_grad(msg)
        self._update()

    def output_grad(self, out: TopOutput) -> tuple[OutputGrad, dict]:
        """CE(head(g), y) on the top's output: the head's gradient into ``.grad`` (no update)
        and ∂l/∂g for the provider. With a frozen bottom this ends the pending step."""
        if self._pending is None or out.step != self._pending[0]:
            raise SplitProtocolError("TopOutput", "step",
                                     f"step {out.step} does not answer the pending release "
                                     f"{self._pending[0] if self._pending else None}")
        idx = self._pending[1]
        if out.output.shape != (len(idx), self.head.in_features):
            raise SplitProtocolError("TopOutput", "output",
                                     f"shape {tuple(out.output.shape)}, expected "
                                     f"{(len(idx), self.head.in_features)}")
        g = out.output.detach().float().requires_grad_(True)
        logits = self.head(g)
        y = self._labels[idx]
        loss = nn.functional.cross_entropy(logits, y)
        loss.backward()
        acc = float((logits.argmax(-1) == y).float().mean())
        if self._pending[2] is None:
            self._pending = None
        return OutputGrad(out.step, g.grad.detach()), {"loss": loss.item(), "acc": acc}

    def input_grad(self, msg: ActivationGrad) -> None:
        """Unfrozen bottom: the provider's input gradient backpropagated into the bottom's
        ``.grad`` (no update); ends the pending step."""
        if self._pending is None or self._pending[2] is None or msg.step != self._pending[0]:
            raise SplitProtocolError("ActivationGrad", "step",
                                     f"step {msg.step} answers no pending release")
        h = self._pending[2]
        if tuple(msg.grad.shape) != tuple(h.shape):
            raise SplitProtocolError("ActivationGrad", "grad",
                                     f"shape {tuple(msg.grad.shape)} != {tuple(h.shape)}")
        h.backward(msg.grad.to(h.device, h.dtype))
        self._pending = None

    def _update(self) -> None:
        """The step by hand (:meth:`loss_grad`, :meth:`apply`); :func:`train_split` leaves it
        to :func:`rapt.training.loop.run_loop`."""
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def encode(self, rows: Sequence[Sequence[int]], step: int = 0) -> Activations:
        """Inference release: fresh privatization of ``rows`` (SAP §4.5), no graph kept."""
        ids, mask = _pad(rows, self.pad_id)
        h = self._run_bottom(self.privatize(ids), mask)
        return Activations(step, h.float().cpu(), mask)

    @torch.no_grad()
    def probabilities(self, out: TopOutput) -> Tensor:
        """Class probabilities (B, C) from the top's output."""
        return self.head(out.output.float()).softmax(-1)

    def state_dict(self) -> dict:
        """What the customer keeps (locally, never sent): its output layer, its bottom when
        trained, the contributing tokens, optimizer and schedule states, and, for a frozen
        bottom, the privatized ids already released, so a resumed run re-sends the *same*
        release instead of drawing a second one (which would give the provider another look at
        every row); with ``privatize="output"`` the released states themselves, for the same
        reason (the ids are the clean ones there). Privacy-noise generator state is never saved
        (rapt.noise)."""
        state = {"kind": "split-customer", "split_layer": self.config.split_layer,
                 "head": {k: v.detach().cpu().clone() for k, v in self.head.state_dict().items()},
                 "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                 "scheduler": copy.deepcopy(self.scheduler.state_dict())
                 if self.scheduler is not None else None,
                 "cti_tokens": list(self.cti.token_ids) if self.cti is not None else None,
                 "released_ids": [t.clone() for t in self._cache_ids]
                 if self._cache_ids is not None else None,
                 "released_hidden": [t.clone() for t in self._cache_hidden]
                 if self._cache_hidden is not None and self.output_noise is not None
                 else None,
                 "replaced": self.replaced, "perturbable": self.perturbable,
                 # label DP: the randomized labels trained on (a second draw on resume would
                 # give the provider a second look at every label)
                 "trained_labels": self._labels.clone()
                 if self.config.label_dp_epsilon is not None else None}
        if self.config.unfreeze_bottom:
            state["bottom"] = {k: v.detach().cpu().clone()
                               for k, v in self.bottom.state_dict().items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume after :meth:`load` (same rows and labels): restores everything
        :meth:`state_dict` saved and re-encodes the saved release."""
        if state.get("kind") != "split-customer":
            raise ValueError(f"not a customer state (kind {state.get('kind')!r})")
        if state.get("split_layer") != self.config.split_layer:
            raise ValueError(f"state has split_layer={state.get('split_layer')}, this customer "
                             f"{self.config.split_layer}")
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if "bottom" in state:
            self.bottom.load_state_dict(state["bottom"])
        self.replaced, self.perturbable = int(state["replaced"]), int(state["perturbable"])
        if self.config.label_dp_epsilon is not None:
            if state.get("trained_labels") is None or \
                    len(state["trained_labels"]) != len(self._labels):
                raise ValueError("state holds no randomized labels for these rows: a label-DP "
                                 "customer cannot resume without drawing them again")
            self._labels = state["trained_labels"].clone().long()
        if state.get("released_ids") is not None:
            if len(state["released_ids"]) != len(self._rows):
                raise ValueError(f"state released {len(state['released_ids'])} rows, "
                                 f"{len(self._rows)} are loaded")
            hidden = state.get("released_hidden")
            if self.output_noise is not None and hidden is None:
                raise ValueError("state holds no released states: a privatize='output' "
                                 "customer cannot re-encode without drawing new noise")
            self._encode_cache([t.clone() for t in state["released_ids"]],
                               [t.clone() for t in hidden] if hidden is not None else None)


def setup_split(bb: Backbone, config: SplitConfig, num_labels: int, n_examples: int, *,
                privatizer: Privatizer | None = None) -> tuple[SplitCustomer, ProviderSession]:
    """Both parties for a job on ``bb``: the provider splits the model, keeps and tunes the
    top, hands the bottom to the customer; the customer builds its privatizer (over the public
    initial embeddings; noise seeded only by ``config.noise_seed``). A ``privatizer`` passed in
    (same η) is reused, e.g. to share one search index across benchmark runs."""
    body_layers = bb.model.config.num_hidden_layers
    config.check_layers(int(body_layers))
    bottom, top = split_backbone(bb, config.split_layer, pooling=config.pooling)
    tune_top(top, config, bb.embeddings.detach())
    steps = total_steps(n_examples, config)
    provider = ProviderSession(top, config, steps, n_examples)
    return make_customer(bb, bottom, config, num_labels, privatizer=privatizer), provider


def make_customer(bb: Backbone, bottom: Bottom, config: SplitConfig, num_labels: int, *,
                  privatizer: Privatizer | None = None) -> SplitCustomer:
    """The customer around ``bottom`` (from :func:`split_backbone`, or downloaded from the
    provider): ``bb`` gives the tokenizer's pad, special and candidate ids; the privatizer
    searches the bottom's token embeddings (noise seeded only by ``config.noise_seed``)."""
    if privatizer is not None and (config.eta is None or privatizer.eta != config.eta):
        raise ValueError(f"the privatizer's η ({privatizer.eta}) is not config.eta "
                         f"({config.eta})")
    if privatizer is not None and config.privatize != "tokens":
        raise ValueError("a token privatizer was passed but config.privatize is "
                         f"{config.privatize!r}: output noise needs none")
    if privatizer is None and config.eta is not None and config.privatize == "tokens":
        # The bottom's own (initial, public) token embeddings: the ones the release goes through.
        emb = bottom.word_embeddings.weight.detach().clone()
        cand = candidate_ids_from_tokenizer(bb.tokenizer, emb.shape[0])
        privatizer = Privatizer(emb, config.eta, special_ids=bb.special_ids,
                                candidate_ids=cand, mode=config.privatizer_mode,
                                seed=config.noise_seed)
    return SplitCustomer(bottom, config, num_labels, hidden_size=bb.hidden_size,
                         pad_id=bb.tokenizer.pad_token_id, special_ids=bb.special_ids,
                         privatizer=privatizer)


class SplitStep(PlainStep):
    """One SAP exchange as a :class:`rapt.training.loop.GradientStep`: the customer releases
    the batch, the provider (in process, or :class:`rapt.split.remote.RemoteProvider`) runs
    the top, the customer's loss on its labels gives ∂l/∂g, the provider applies its own update
    (once, whatever happens to the replies over HTTP), and with an unfrozen bottom ∂l/∂hidden
    comes back. ``compute`` leaves the head's (and bottom's) gradients in ``.grad``:
    :func:`rapt.training.loop.run_loop` steps the customer's optimizer and schedule.

    Batches are :func:`rapt.training.loop.shuffled_batches` of ``config.seed``; message step
    ids continue after the provider's last one (it may have seen a forward whose backward never
    came)."""

    def __init__(self, customer: SplitCustomer, provider: ProviderSession, *,
                 observe: Callable[[list[int], Activations], None] | None = None,
                 observe_grad: Callable[[list[int], OutputGrad], None] | None = None) -> None:
        cfg = customer.config
        self.customer, self.provider = customer, provider
        self.observe, self.observe_grad = observe, observe_grad
        self.plan = Plan.of_batches(customer.num_examples, cfg.batch_size, cfg.epochs)
        self.next_id = provider._last_step + 1

    def batches(self, epoch: int, skip: int) -> list[Tensor]:
        cfg = self.customer.config
        return shuffled_batches(self.customer.num_examples, cfg.batch_size, cfg.seed,
                                epoch)[skip:]

    def compute(self, idx: Tensor) -> StepStats:
        customer, provider, rows = self.customer, self.provider, idx.tolist()
        customer.optimizer.zero_grad(set_to_none=True)  # nothing left from a failed exchange
        acts = customer.release(rows, self.next_id)
        if self.observe is not None:
            self.observe(rows, acts)
        grad, stats = customer.output_grad(provider.forward(acts))
        if self.observe_grad is not None:
            self.observe_grad(rows, grad)
        back = provider.backward(grad)
        if back is not None:
            customer.input_grad(back)
        self.next_id += 1
        return stats


def train_split(customer: SplitCustomer, provider: ProviderSession, *,
                progress: Callable[[dict], None] | None = None,
                observe: Callable[[list[int], Activations], None] | None = None,
                should_stop: Callable[[], bool] | None = None,
                observe_grad: Callable[[list[int], OutputGrad], None] | None = None
                ) -> list[dict]:
    """Run the message exchange for ``config.epochs`` epochs over the loaded rows: a
    :class:`SplitStep` in :func:`rapt.training.loop.run_loop`; -> this call's history.

    Every value that crosses between the parties is a protocol message; the same loop runs
    over HTTP once the two calls on ``provider`` become requests. ``observe(idx, acts)`` sees
    each release with the rows it came from (a measurement hook for the attack benchmarks:
    it is what the provider receives, plus the ground-truth row index); ``observe_grad(idx,
    grad)`` likewise sees each ∂l/∂g the provider receives (the label-inference attack's
    input, :mod:`rapt.attacks.label_inference`). After both parties
    loaded a checkpoint it continues where ``provider.step`` says: data order depends only on
    ``config.seed`` and the epoch, so the remaining batches are the same ones."""
    if customer.num_examples == 0 or customer.scheduler is None:
        raise ValueError("no training rows: call customer.load(rows, labels) first")
    step = SplitStep(customer, provider, observe=observe, observe_grad=observe_grad)
    comps: dict[str, Any] = {"head": customer.head, "optimizer": customer.optimizer,
                             "scheduler": customer.scheduler}
    if customer.config.unfreeze_bottom:
        comps["bottom"] = customer.bottom
    # the provider's applied steps are the count that resumes (it holds the other half)
    state = TrainState("split-customer", customer.config.method, customer.num_examples,
                       comps, step=provider.step)
    run_loop(step, customer.optimizer, customer.scheduler, state, progress=progress,
             should_stop=should_stop)
    return state.history


def predict_split(customer: SplitCustomer, provider: ProviderSession,
                  rows: Sequence[Sequence[int]], batch_size: int = 64) -> Tensor:
    """Class probabilities (N, C): customer privatizes and encodes, provider runs the top,
    customer applies its output layer."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out = torch.empty(len(rows), customer.num_labels)
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        top_out = provider.forward(customer.encode([rows[i] for i in idx]), train=False)
        out[idx] = customer.probabilities(top_out)
    return out
