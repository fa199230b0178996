"""The provider over HTTP: :class:`RemoteProvider` has :class:`ProviderSession`'s interface
(``forward``, ``backward``, ``step``, ``total_steps``), so :func:`train_split` and
:func:`predict_split` run unchanged against a session of the service (``/v1/sap/...``).

This is the client half of the wire and the only module of ``rapt.split`` that does I/O, through
the :class:`rapt.http.HttpSession` it is given (:meth:`rapt.client.client.RaptClient.sap_provider`
passes its own). A frozen bottom's release is uploaded once
(:meth:`RemoteProvider.upload_release`); its training batches then travel as row indices
(``BatchRef``). A dropped connection is retried for ``retry_s`` seconds with the same step
number, so a step is applied once whatever happens to the replies (see
:mod:`rapt.service.split_sessions` for the rule); a restarted server that lost the pending
forward answers 409 ``no_forward`` and the forward is sent again.
"""

from __future__ import annotations

from typing import Any

import torch

from rapt.http import HttpSession, ServiceError
from rapt.split import wire
from rapt.split.protocol import (
    ActivationGrad,
    Activations,
    BatchRef,
    OutputGrad,
    SplitProtocolError,
    TopOutput,
)

__all__ = ["RemoteProvider"]

MAX_RESPONSE = 1 << 30  # a reply is a (B, h) or (B, n, h) float tensor: far below this


class RemoteProvider:
    """ProviderSession's interface on a remote session. ``customer`` (its SplitCustomer) is
    needed to train with a frozen bottom: a batch is then named by the customer's pending
    rows instead of re-sending their activations."""

    def __init__(self, http: HttpSession, session_id: str, customer: Any = None, *,
                 retry_s: float = 120.0) -> None:
        self.http, self.session_id, self.customer = http, session_id, customer
        self.retry_s = float(retry_s)
        info = self.status()
        self.info = info
        self.total_steps = int(info["total_steps"])
        self.unfreeze_bottom = bool(info["unfreeze_bottom"])
        self.step = int(info["steps_done"])  # applied steps (train_split skips these)
        self._last_step = int(info["last_step"])
        self._forward_body: bytes | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self.resent_forwards = 0  # forwards sent again after a 409 no_forward (restarts)

    # -- transport --------------------------------------------------------------------------
    def status(self) -> dict:
        """The session as the service reports it (steps_done, last_step, rows_received, ...)."""
        return self.http.call("GET", f"/v1/sap/sessions/{self.session_id}")

    def _post(self, what: str, data: bytes) -> Any:
        """POST a message, retrying transport failures (server restarting, connection
        dropped) until ``retry_s``; the service makes the repeat harmless."""
        r = self.http.request_retrying(
            "POST", f"/v1/sap/sessions/{self.session_id}/{what}", retry_s=self.retry_s,
            content=data, headers={"Content-Type": "application/octet-stream"})
        self.bytes_sent += len(data)
        self.bytes_received += len(r.content)
        return r

    @staticmethod
    def _message(r: Any, expect: type) -> Any:
        return wire.decode(r.content, expect, max_bytes=MAX_RESPONSE)

    # -- the ProviderSession interface ------------------------------------------------------
    def upload_release(self, customer: Any = None, *, chunk_bytes: int = 8 << 20) -> int:
        """Frozen bottom: upload the customer's one release (the rows the session does not
        have yet) in chunks of about ``chunk_bytes``; returns the rows sent."""
        customer = customer or self.customer
        if self.unfreeze_bottom:
            raise ValueError("this session trains the bottom: it takes no release")
        n = customer.num_examples
        start = int(self.status()["rows_received"])
        h = customer.head.in_features
        per_row = customer.config.max_length * h * 4
        rows = max(1, chunk_bytes // per_row)
        for s in range(start, n, rows):
            self._post("release", wire.encode(customer.frozen_release(s, min(n, s + rows))))
        return n - start

    def forward(self, acts: Activations, *, train: bool = True) -> TopOutput:
        """Training: step ``acts.step`` (frozen bottom: only the pending rows' indices are
        sent). Inference (``train=False``): the activations of a query batch."""
        msg: Any = Activations(acts.step, acts.hidden.float(), acts.mask.bool())
        if not train:
            return self._message(self._post("predict", wire.encode(msg)), TopOutput)
        if not self.unfreeze_bottom:
            rows = self.customer.pending_rows if self.customer is not None else None
            if rows is None:
                raise ValueError("a frozen-bottom session needs RemoteProvider(customer=...) "
                                 "with a pending release (customer.release(rows, step))")
            msg = BatchRef(acts.step, torch.tensor(rows, dtype=torch.int32))
        self._forward_body = wire.encode(msg)
        out = self._message(self._post("forward", self._forward_body), TopOutput)
        if out.step != acts.step:
            raise SplitProtocolError("TopOutput", "step", f"answers step {out.step}, sent "
                                                          f"{acts.step}")
        self._last_step = acts.step
        return out

    def backward(self, msg: OutputGrad) -> ActivationGrad | None:
        """Send ∂l/∂g; the provider applies the step once. Returns ∂l/∂hidden when the bottom
        trains, else None."""
        data = wire.encode(msg)
        try:
            r = self._post("backward", data)
        except ServiceError as e:
            if e.status != 409 or e.error != "no_forward" or self._forward_body is None:
                raise
            # The server restarted (or evicted the session) between forward and backward:
            # recompute the same g there, then apply.
            self._post("forward", self._forward_body)
            self.resent_forwards += 1
            r = self._post("backward", data)
        self.step = int(r.headers.get("x-rapt-last-step", msg.step)) + 1
        self._forward_body = None
        if r.headers.get("content-type", "").startswith("application/json"):
            return None
        back = self._message(r, ActivationGrad)
        if back.step != msg.step:
            raise SplitProtocolError("ActivationGrad", "step", f"answers step {back.step}, "
                                                               f"sent {msg.step}")
        return back

    def discard(self, *, rewind: bool = False) -> None:
        """Nothing to drop here: the next forward of the same step replaces the pending one."""
        self._forward_body = None
