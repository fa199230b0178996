"""SAP split training as a service: the provider's side of ``/v1/sap/...``.

The provider keeps the top and its tuned adapter; the customer downloads the bottom
(:meth:`SplitSessions.bottom`), keeps its labels and output layer, and drives the loop. A
session wraps one :class:`rapt.split.ProviderSession`; messages arrive as safetensors
(:mod:`rapt.split.wire`) and are checked before anything changes.

Step rule (exactly once). Steps are numbered 0, 1, ... and the session's ``last_step`` is the
last *applied* one. ``forward`` must carry ``last_step + 1`` (a repeat of it recomputes the
same g: a retry after a lost reply); any other step is 409 ``step_conflict``. ``backward`` of
``last_step + 1`` applies the update once, then saves the session (trainable top tensors,
optimizer, scheduler, step counters and the reply) atomically to ``state.pt`` before it
answers. A repeated ``backward`` of ``last_step`` is answered idempotently from that saved reply
(header ``X-Rapt-Replayed: 1``) and changes nothing; a repeat whose body differs from the applied
one (compared by SHA-256) is 409 ``replay_mismatch``. After a restart the pending forward is
gone: ``backward`` then answers 409 ``no_forward`` and the client sends ``forward`` again
(the top is deterministic, so g is the same). Every 409 carries ``X-Rapt-Last-Step``.

A ``backward`` is all or nothing (:meth:`rapt.split.ProviderSession.backward`): a gradient
that overflows in the top, or an update that would leave it non-finite, is a 422 with nothing
changed, and a step whose state could not be saved drops the session from memory before the
error goes out, so no answer, replay or later step ever rests on an unsaved step. ``DELETE``
never loads the session: one whose files no longer load is deleted all the same.

A frozen bottom's training set crosses once: ``release`` chunks (``Release``, contiguous from
row 0; a repeated chunk is accepted and changes nothing) are kept as files beside the store,
and ``forward`` then takes a ``BatchRef`` (row indices) instead of activations.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rapt.service.limits import Limits
from rapt.service.store import QuotaError, Store
from rapt.split import wire
from rapt.split.config import PROVIDER_FIELDS, SplitConfig
from rapt.split.customer import total_steps
from rapt.split.model import split_backbone
from rapt.split.protocol import (
    Activations,
    BatchRef,
    OutputGrad,
    Release,
    SplitProtocolError,
)
from rapt.split.provider import ProviderSession, tune_top

log = logging.getLogger("rapt.service")

STATE_FILE = "state.pt"
BOTTOM_FORMAT = "rapt-sap-bottom"


class SapError(Exception):
    """A client-caused problem, answered as the service's JSON error; ``last_step`` (when
    known) goes into the ``X-Rapt-Last-Step`` header so the client can resume."""

    def __init__(self, status: int, error: str, detail: str, last_step: int | None = None):
        super().__init__(detail)
        self.status, self.error, self.detail, self.last_step = status, error, detail, last_step


@dataclass
class _Live:
    """A session loaded in memory (one lock: one message at a time per session)."""

    row: dict[str, Any]
    config: SplitConfig
    provider: ProviderSession
    # Frozen: (n_i, h) per row, in the dtype it was uploaded in (a half-precision release
    # stays half precision; each batch is converted to the top's dtype when it is used).
    release: list[Tensor] = field(default_factory=list)
    release_bytes: int = 0
    top_bytes: int = 0  # the session's copy of the top (parameters and buffers)
    reply: Tensor | None = None  # ActivationGrad.grad of the last applied step (unfrozen)
    applied: str | None = None  # SHA-256 of the last applied OutputGrad body (replays match it)
    lengths: Tensor | None = None  # valid positions per row of the replied batch
    pending_lengths: Tensor | None = None  # ... and of the pending forward
    lock: threading.Lock = field(default_factory=threading.Lock)
    evicted: bool = False  # dropped from memory: a newer copy may exist, use none of this one

    @property
    def last_step(self) -> int:
        return self.provider.step - 1  # steps are consecutive from 0

    @property
    def memory(self) -> int:
        """Bytes this session holds in memory (its top and release)."""
        return self.top_bytes + self.release_bytes


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)  # a crash leaves the old file or the new one, never half of one


class SplitSessions:
    """All SAP sessions of the process: loaded lazily from the store, at most ``max_live`` in
    memory, of which ``limits.max_sap_live_sessions_per_key`` of one key, holding at most
    ``limits.max_sap_live_bytes`` (an evicted session is reloaded from its files; its pending
    forward is dropped)."""

    def __init__(self, store: Store, backbones: dict[str, Any], limits: Limits,
                 max_live: int | None = None):
        self.store, self.backbones, self.limits = store, backbones, limits
        self.max_live = limits.max_sap_live_sessions if max_live is None else max_live
        self._live: collections.OrderedDict[str, _Live] = collections.OrderedDict()
        self._lock = threading.Lock()  # the _live table and session loading
        self._bottoms: collections.OrderedDict[tuple[str, int], tuple[bytes, str]] = \
            collections.OrderedDict()

    # -- bottom -----------------------------------------------------------------------------
    def _check_split(self, backbone: str, split_layer: int) -> Any:
        if backbone not in self.backbones:
            raise SapError(422, "unknown_backbone", f"backbone '{backbone}' is not loaded here; "
                           f"available: {', '.join(self.backbones)}")
        bb = self.backbones[backbone]
        try:
            SplitConfig(split_layer=split_layer).check_layers(
                int(bb.model.config.num_hidden_layers))
        except ValueError as e:
            raise SapError(422, "validation_error", str(e)) from None
        return bb

    def bottom(self, backbone: str, split_layer: int) -> tuple[bytes, str]:
        """The bottom (embedding layer + ``split_layer`` blocks) as safetensors bytes and their
        SHA-256. Only the bottom's modules are serialized: nothing of the top."""
        bb = self._check_split(backbone, split_layer)
        key = (backbone, split_layer)
        with self._lock:
            if key in self._bottoms:
                self._bottoms.move_to_end(key)
                return self._bottoms[key]
        from safetensors.torch import save

        bottom, _ = split_backbone(bb, split_layer)
        tensors = {k: v.detach().cpu().clone().contiguous()
                   for k, v in bottom.state_dict().items()}
        data = save(tensors, metadata={"format": BOTTOM_FORMAT, "backbone": backbone,
                                       "split_layer": str(split_layer)})
        out = (data, hashlib.sha256(data).hexdigest())
        with self._lock:
            self._bottoms[key] = out
            while len(self._bottoms) > 2:  # MiniLM's is ~50 MB
                self._bottoms.popitem(last=False)
        return out

    # -- sessions ---------------------------------------------------------------------------
    def create(self, owner: str, backbone: str, params: dict[str, Any],
               n_examples: int) -> dict[str, Any]:
        """A new session (nothing trained yet) from the provider's part of a SplitConfig."""
        bb = self._check_split(backbone, params["split_layer"])
        try:
            cfg = SplitConfig(**{k: params[k] for k in PROVIDER_FIELDS})
        except (TypeError, ValueError) as e:
            raise SapError(422, "validation_error", str(e)) from None
        lim = self.limits
        for name, value, limit, limit_name in (
                ("n_examples", n_examples, lim.max_examples, "max_examples"),
                ("batch_size", cfg.batch_size, lim.max_predict_rows, "max_predict_rows"),
                ("max_length", cfg.max_length, lim.max_seq_len, "max_seq_len")):
            if value > limit:
                raise SapError(422, "limit_exceeded",
                               f"{name}={value} is over the limit {limit_name}={limit}")
        del bb
        steps = total_steps(n_examples, cfg)
        try:
            sid = self.store.create_sap_session(owner, backbone, cfg.provider_view(), n_examples,
                                                steps, max_count=lim.max_sap_sessions_per_key)
        except QuotaError as e:
            raise SapError(429, "quota_exceeded", str(e)) from None
        return self.store.get_sap_session(sid, owner)

    def row(self, owner: str, sid: str) -> dict[str, Any]:
        """The caller's session row; 404 for a missing one and for another key's."""
        row = self.store.get_sap_session(sid, owner)
        if row is None:
            raise SapError(404, "not_found", f"no sap session '{sid}'")
        return row

    def _get(self, owner: str, sid: str) -> _Live:
        row = self.row(owner, sid)
        with self._lock:
            live = self._live.get(sid)
            if live is None:
                self._make_room(owner, sid, int(row.get("release_bytes") or 0))
                live = self._load(row)
                self._make_room(owner, sid, live.memory)  # the top's copy too, now known
                self._live[sid] = live
            self._live.move_to_end(sid)
        return live

    def _make_room(self, owner: str, sid: str, need: int) -> None:
        """Under ``self._lock``: drop idle sessions, least recently used first, until session
        ``sid`` of ``owner`` (in memory or about to be) fits the in-memory limits with ``need``
        more bytes; 429 when the sessions in the way are all in use."""
        lim = self.limits

        def others(of_owner: bool) -> list[_Live]:
            return [v for k, v in self._live.items()
                    if k != sid and (not of_owner or v.row["owner"] == owner)]

        def held() -> int:
            own = self._live[sid].memory if sid in self._live else 0
            return own + sum(v.memory for v in others(False))

        while len(others(True)) + 1 > lim.max_sap_live_sessions_per_key:
            if not self._evict_one(sid, owner):
                raise SapError(429, "sap_busy", f"this key has {len(others(True))} SAP sessions "
                               "in memory, all in use; the limit is max_sap_live_sessions_per_"
                               f"key={lim.max_sap_live_sessions_per_key}: retry when one of "
                               "its requests has ended")
        while len(others(False)) + 1 > self.max_live:
            if not self._evict_one(sid):
                raise SapError(429, "sap_busy", f"the server has {len(others(False))} SAP "
                               "sessions in memory, all in use; the limit is max_sap_live_"
                               f"sessions={self.max_live}: retry shortly")
        while held() + need > lim.max_sap_live_bytes:
            if not self._evict_one(sid):
                raise SapError(429, "sap_busy", f"the SAP sessions in memory hold {held()} "
                               f"bytes and this one needs {need} more; the limit is "
                               f"max_sap_live_bytes={lim.max_sap_live_bytes}: retry shortly")

    def _evict_one(self, sid: str, owner: str | None = None) -> bool:
        """Under ``self._lock``: drop the least recently used idle session other than ``sid``
        (of ``owner`` when given); False when there is none. Only an idle session is dropped,
        marked under its own lock, so a request that already holds it never acts on a stale
        copy."""
        for k, v in list(self._live.items()):
            if k == sid or (owner is not None and v.row["owner"] != owner):
                continue
            if v.lock.acquire(blocking=False):
                v.evicted = True
                v.lock.release()
                del self._live[k]
                return True
        return False

    @contextmanager
    def _session(self, owner: str, sid: str) -> Iterator[_Live]:
        """The live session, locked: one message at a time, on the one current copy."""
        while True:
            live = self._get(owner, sid)
            with live.lock:
                if not live.evicted:
                    yield live
                    return

    def _load(self, row: dict[str, Any]) -> _Live:
        """Rebuild a session from its config (deterministic init from ``seed``), then its saved
        state and release files, if any."""
        if row["backbone"] not in self.backbones:
            raise SapError(503, "backbone_unavailable",
                           f"sap session '{row['id']}' needs backbone '{row['backbone']}', which "
                           "this server did not load (start it with --backbone for it)")
        bb = self.backbones[row["backbone"]]
        cfg = SplitConfig(**row["config"])
        _, top = split_backbone(bb, cfg.split_layer, pooling=cfg.pooling)
        tune_top(top, cfg, bb.embeddings.detach())
        live = _Live(row, cfg, ProviderSession(top, cfg, int(row["total_steps"]),
                                               int(row["n_examples"])),
                     top_bytes=sum(t.numel() * t.element_size()
                                   for t in (*top.parameters(), *top.buffers())))
        folder = Path(row["path"])
        state_path = folder / STATE_FILE
        if state_path.exists():
            state = torch.load(state_path, map_location="cpu", weights_only=True)
            live.provider.load_state_dict(state["provider"])
            live.reply, live.lengths = state.get("reply"), state.get("lengths")
            live.applied = state.get("applied")
        sizes = {"state_bytes": state_path.stat().st_size if state_path.exists() else 0}
        if not cfg.unfreeze_bottom:
            max_bytes = self.limits.max_sap_release_bytes
            for f in sorted(folder.glob("release-*.safetensors")):
                data = f.read_bytes()
                live.release += wire.decode(data, Release, max_bytes=max_bytes).rows()
                live.release_bytes += len(data)
        sizes.update(last_step=live.last_step, rows_received=len(live.release),
                     release_bytes=live.release_bytes)
        if any(row.get(k) != v for k, v in sizes.items()):
            # the files are the truth: the row may lag by one step after a crash
            self.store.update_sap_session(row["id"], **sizes)
            row.update(sizes)
        return live

    def info(self, owner: str, sid: str) -> dict[str, Any]:
        return self._info(self.row(owner, sid))

    @staticmethod
    def _info(row: dict[str, Any]) -> dict[str, Any]:
        c = row["config"]
        return {"id": row["id"], "backbone": row["backbone"], "config": c,
                "split_layer": c["split_layer"], "method": c["method"],
                "unfreeze_bottom": c["unfreeze_bottom"], "n_examples": row["n_examples"],
                "total_steps": row["total_steps"], "last_step": row["last_step"],
                "steps_done": row["last_step"] + 1, "rows_received": row["rows_received"],
                "created": row["created"]}

    def _forget(self, sid: str, live: _Live) -> None:
        """Drop ``live`` (its lock held by the caller) from memory for good."""
        live.evicted = True
        with self._lock:
            if self._live.get(sid) is live:
                del self._live[sid]

    def delete(self, owner: str, sid: str) -> None:
        """Delete a session whatever its state: nothing is loaded (a session whose files or
        config no longer load is deleted too), the row goes first, so no new request finds it,
        then the copy in memory (after the request using it, if any), then the files."""
        path = self.store.delete_sap_session(sid, owner)
        if path is None:
            raise SapError(404, "not_found", f"no sap session '{sid}'")
        with self._lock:
            live = self._live.pop(sid, None)
        if live is not None:
            with live.lock:  # waits for a message being applied to end
                live.evicted = True
        root = (self.store.files / "sap").resolve()
        if Path(path).resolve().parent == root:  # only ever our own folders
            shutil.rmtree(path, ignore_errors=True)

    # -- messages ---------------------------------------------------------------------------
    def _decode(self, data: bytes, expect: type | tuple[type, ...]) -> Any:
        try:
            return wire.decode(data, expect, max_bytes=self.limits.max_upload_bytes)
        except SplitProtocolError as e:
            raise SapError(422, "invalid_message", str(e)) from None

    def _check_acts(self, live: _Live, hidden: Tensor, what: str, max_rows: int,
                    max_rows_name: str) -> None:
        h = live.provider.hidden_size
        B, n, d = hidden.shape
        if d != h:
            raise SapError(422, "invalid_message", f"{what}.hidden: last dimension is {d}, this "
                           f"session's top expects {h}")
        if n > live.config.max_length:
            raise SapError(422, "limit_exceeded", f"{what}.hidden: {n} positions, over the "
                           f"session's max_length={live.config.max_length}")
        if B > max_rows:
            raise SapError(422, "limit_exceeded", f"{what}.hidden: {B} rows, over the limit "
                           f"{max_rows_name}={max_rows}")

    def upload_release(self, owner: str, sid: str, data: bytes) -> dict[str, Any]:
        """Frozen bottom: store rows ``offset..`` of the release (contiguous; a chunk already
        received is accepted again and changes nothing)."""
        with self._session(owner, sid) as live:  # ownership first: another key gets 404
            msg = self._decode(data, Release)
            return self._store_release(live, sid, msg, data)

    def _store_release(self, live: _Live, sid: str, msg: Release, data: bytes
                       ) -> dict[str, Any]:
        """Under the session's lock: check and keep one chunk."""
        if live.config.unfreeze_bottom:
            raise SapError(409, "unfrozen_bottom", f"sap session '{sid}' trains the bottom: "
                           "activations come with each forward, there is no release to upload")
        B, h = msg.lengths.numel(), live.provider.hidden_size
        if msg.hidden.shape[1] != h:
            raise SapError(422, "invalid_message", f"Release.hidden: last dimension is "
                           f"{msg.hidden.shape[1]}, this session's top expects {h}")
        if int(msg.lengths.max()) > live.config.max_length:
            raise SapError(422, "limit_exceeded", f"Release.lengths: a row of "
                           f"{int(msg.lengths.max())} positions, over the session's "
                           f"max_length={live.config.max_length}")
        have, n = len(live.release), int(live.row["n_examples"])
        if msg.offset + B > n:
            raise SapError(422, "invalid_message", f"Release.offset: rows {msg.offset}.."
                           f"{msg.offset + B - 1} go past the session's n_examples={n}")
        if msg.offset + B <= have:
            return self._info(live.row)  # a retried chunk: already stored
        if msg.offset != have:
            raise SapError(409, "release_gap", f"Release.offset={msg.offset}: the session "
                           f"has rows 0..{have - 1}; send offset={have} next")
        if live.release_bytes + len(data) > self.limits.max_sap_release_bytes:
            raise SapError(413, "payload_too_large", "the release would exceed the limit "
                           f"max_sap_release_bytes={self.limits.max_sap_release_bytes}")
        with self._lock:  # the chunk will be held in memory too
            self._make_room(live.row["owner"], sid, len(data))
        path = Path(live.row["path"]) / f"release-{msg.offset:012d}.safetensors"
        try:  # the file counts in the key's storage quota, checked and recorded with it
            self.store.add_sap_release(
                sid, live.row["owner"], len(data), have + B,
                lambda: _atomic_write(path, lambda p: p.write_bytes(data)),
                max_bytes=self.limits.max_dataset_bytes_per_key)
        except QuotaError as e:
            raise SapError(429, "quota_exceeded", str(e)) from None
        live.release += msg.rows()  # views of the chunk's one tensor, in its dtype
        live.release_bytes += len(data)
        live.row.update(rows_received=len(live.release),
                        release_bytes=live.release_bytes)
        return self._info(live.row)

    def _step_conflict(self, live: _Live, what: str, step: int) -> SapError:
        last = live.last_step
        if last + 1 >= live.provider.total_steps:
            why = f"the session is complete ({live.provider.total_steps} steps applied)"
        elif step <= last:
            why = f"step {step} was already applied"
        else:
            why = f"step {step} skips ahead"
        return SapError(409, "step_conflict", f"{what}.step={step}: {why}; the session's "
                        f"last_step is {last}, the next step is {last + 1}", last)

    def forward(self, owner: str, sid: str, data: bytes) -> bytes:
        """Training forward of step ``last_step + 1`` -> TopOutput bytes (the graph is kept
        for the matching backward)."""
        with self._session(owner, sid) as live:
            msg = self._decode(data, (BatchRef, Activations))
            frozen = not live.config.unfreeze_bottom
            what = type(msg).__name__
            if isinstance(msg, BatchRef) != frozen:
                want = "BatchRef" if frozen else "Activations"
                raise SapError(422, "invalid_message", f"{what}: expected a {want} message "
                               f"(this session's bottom is {'frozen' if frozen else 'unfrozen'})")
            p = live.provider
            if msg.step != live.last_step + 1 or msg.step >= p.total_steps:
                raise self._step_conflict(live, what, msg.step)
            if frozen:
                have, n = len(live.release), int(live.row["n_examples"])
                if have < n:
                    raise SapError(409, "release_incomplete", f"the release has {have} of {n} "
                                   f"rows: upload rows {have}.. first", live.last_step)
                rows = msg.rows.tolist()
                if max(rows) >= n:
                    raise SapError(422, "invalid_message", f"BatchRef.rows: index {max(rows)} "
                                   f"is not a row of the release (n_examples={n})")
                # this batch only, in the top's dtype (the release stays as uploaded)
                hidden, mask = wire.pad_rows([live.release[i] for i in rows],
                                             dtype=next(p.top.parameters()).dtype)
                acts = Activations(msg.step, hidden, mask)
            else:
                acts = msg
            self._check_acts(live, acts.hidden, what, live.config.batch_size, "batch_size")
            if p.pending_step is not None:
                p.discard(rewind=True)  # a repeated forward: recompute the same g
            try:
                out = p.forward(acts)
            except SplitProtocolError as e:
                raise SapError(422, "invalid_message", str(e)) from None
            live.pending_lengths = acts.mask.long().sum(1)
            return wire.encode(out)

    def backward(self, owner: str, sid: str, data: bytes) -> tuple[bytes | None, bool, int]:
        """Apply ∂l/∂g of the pending step exactly once and save the session. Returns
        (ActivationGrad bytes or None for a frozen bottom, replayed, last_step)."""
        with self._session(owner, sid) as live:
            msg = self._decode(data, OutputGrad)
            p = live.provider
            last = live.last_step
            digest = hashlib.sha256(data).hexdigest()
            if msg.step == last and last >= 0:  # a retry whose reply was lost
                if live.applied is not None and digest != live.applied:
                    raise SapError(409, "replay_mismatch", f"OutputGrad.step={msg.step}: step "
                                   f"{msg.step} was applied with another body; a retry must "
                                   f"send the same bytes (the next step is {last + 1})", last)
                return self._reply(live, msg.step), True, last
            if msg.step != last + 1:
                raise self._step_conflict(live, "OutputGrad", msg.step)
            if p.pending_step != msg.step:
                raise SapError(409, "no_forward", f"OutputGrad.step={msg.step}: no forward of "
                               f"step {msg.step} is pending here (the server restarted or the "
                               "forward never arrived): send that forward again, then this",
                               last)
            try:
                back = p.backward(msg)  # checks the shape before it changes anything
            except SplitProtocolError as e:
                raise SapError(422, "invalid_message", str(e)) from None
            live.reply = back.grad if back is not None else None
            live.lengths, live.applied = live.pending_lengths, digest
            state = {"provider": p.state_dict(), "reply": live.reply, "lengths": live.lengths,
                     "applied": digest}
            try:
                _atomic_write(Path(live.row["path"]) / STATE_FILE,
                              lambda f: torch.save(state, f))
                self.store.update_sap_session(sid, last_step=live.last_step, state_bytes=(
                    Path(live.row["path"]) / STATE_FILE).stat().st_size)
            except BaseException:
                # This copy is ahead of what was saved: never answer (or replay) from it. The
                # next request reloads the files, the truth.
                self._forget(sid, live)
                raise
            live.row["last_step"] = live.last_step
            return self._reply(live, msg.step), False, live.last_step

    @staticmethod
    def _reply(live: _Live, step: int) -> bytes | None:
        from rapt.split.protocol import ActivationGrad

        if live.reply is None:
            return None
        return wire.encode(ActivationGrad(step, live.reply), lengths=live.lengths)

    def predict(self, owner: str, sid: str, data: bytes) -> bytes:
        """Inference: Activations of a query batch -> TopOutput bytes (no graph, no step
        order; any time, also mid-training)."""
        with self._session(owner, sid) as live:
            msg = self._decode(data, Activations)
            self._check_acts(live, msg.hidden, "Activations", self.limits.max_predict_rows,
                             "max_predict_rows")
            try:
                out = live.provider.forward(msg, train=False)
            except SplitProtocolError as e:
                raise SapError(422, "invalid_message", str(e)) from None
        return wire.encode(out)
