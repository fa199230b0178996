"""Process-wide state of one API process: the store, backbones, job backend, micro-batchers and
the loaded-prompt cache, with the row and backbone checks the routes share."""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rapt.service.channels import Channel, ChannelError, load_channels, recorded_channel
from rapt.service.errors import ServiceError
from rapt.service.inference import (
    Forward,
    MicroBatcher,
    backbone_positions,
    default_forward,
    per_prompt_forward,
)
from rapt.service.jobs import make_job_backend
from rapt.service.limits import ServiceConfig
from rapt.service.split_sessions import SapError, SplitSessions
from rapt.service.store import Store
from rapt.service.throttle import FailureLimiter
from rapt.service.worker import JobRunner

log = logging.getLogger("rapt.service")


def default_prompt_loader(folder: Path) -> Any:
    from rapt.tuning.tune import TunedPrompt

    return TunedPrompt.load(folder)


class Service:
    """Process-wide state: store, backbones, job backend, micro-batchers, prompt cache."""

    def __init__(self, config: ServiceConfig, backbones: dict[str, Any] | None,
                 runner: JobRunner | None, prompt_loader: Callable[[Path], Any] | None,
                 forward: Forward | None):
        self.config = config
        self.limits = config.limits
        # Everything this process writes under the store's folder (checkpoints, prompts,
        # split-session state and releases) is a tenant's data: 0600 files, 0700 folders.
        # Process-wide; restored by close() for processes that host a service among others.
        self._umask = os.umask(0o077)
        # Seconds since the epoch: console sessions' expiry and the failed-key limiter read
        # it (tests replace it to move time on).
        self.clock: Callable[[], float] = time.time
        self.auth_failures = FailureLimiter(self.limits.max_auth_failures,
                                            self.limits.auth_failure_window_s,
                                            lambda: self.clock())
        self.store = Store(config.store_url or config.db_path, files=config.files_dir)
        # A crash between a dataset's file and its row (either way) leaves nothing behind.
        self.store.reconcile_dataset_files()
        # Ray actors load backbones by name themselves; injected ones are sent to them.
        job_backbones = ({n: n for n in config.backbones} if backbones is None
                         else backbones)
        if backbones is None:
            from rapt.models import load_backbone

            backbones = {name: load_backbone(name, device=config.device)
                         for name in config.backbones}
        self.backbones = backbones
        for bb in backbones.values():
            bb.model.eval()
        try:  # before the micro-batchers hook the backbones (a channel copies its encoder)
            self.channels = load_channels(config.channels, backbones)
        except ChannelError:
            self.store.close()
            os.umask(self._umask)
            raise
        self.prompt_loader = prompt_loader or default_prompt_loader
        self.jobs = make_job_backend(
            config.jobs, self.store, backbones if config.jobs == "inprocess" else job_backbones,
            runner, max_queued=self.limits.max_queued_jobs, threads=config.job_threads,
            progress_interval_s=config.progress_interval_s, lease_s=config.lease_s,
            heartbeat_s=config.heartbeat_s, slice_s=config.job_slice_s,
            actors=config.ray_actors,
            address=config.ray_address, actor_options=config.ray_actor_options,
            device=config.device,
            # Ray actors load the channel models from their folders, on their own backbones.
            channels=self.channels if config.jobs == "inprocess" else dict(config.channels))
        forward = forward or (default_forward if config.mixed_passes else per_prompt_forward)
        self.batchers = {
            name: MicroBatcher(bb, forward,
                               max_wait_s=config.batch_wait_ms / 1000,
                               max_rows=config.max_batch_rows,
                               max_pending_rows=self.limits.max_inference_queue)
            for name, bb in backbones.items()}
        self._prompts: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._prompt_lock = threading.Lock()
        self.sap = SplitSessions(self.store, backbones, self.limits)
        # Privatized tokens received, by route family (GET /metrics reads them)
        self.privatized_tokens: collections.Counter[str] = collections.Counter()
        self._tokens_lock = threading.Lock()
        self.jobs.start()

    def close(self) -> None:
        self.jobs.stop()
        for b in self.batchers.values():
            b.close()
        self.store.close()
        os.umask(self._umask)

    def count_privatized(self, family: str, backbone: str, rows: list[list[int]],
                         privacy: dict | None) -> None:
        """Count the tokens of privatized ``rows`` received on a ``family`` of routes
        (datasets, predict); the backbone's special tokens, never privatized, are left out, and
        so are rows under a ``privacy`` declaration of mechanism "none" (sent in clear: for a
        query, the data its prompt was tuned on)."""
        if (privacy or {}).get("mechanism") == "none":
            return
        special = set(self.backbones[backbone].special_ids)
        n = sum(1 for r in rows for t in r if t not in special)
        with self._tokens_lock:
            self.privatized_tokens[family] += n

    def revoke_key(self, ref: str, purge: bool) -> dict:
        """Revoke (and with ``purge`` delete everything of) a key; its running jobs here stop
        at their next step, its split sessions leave this process's memory."""
        kid = self.store.find_key_id(ref, live_only=not purge)
        self.store.check_revocable(kid)  # before anything of the key is deleted
        sessions = 0
        for sid in self.store.owned_sap_sessions(kid):
            try:
                self.sap.delete(kid, sid)  # waits for a message in flight, then drops it
                sessions += 1
            except SapError:
                pass  # deleted meanwhile
        out = self.store.purge_key(kid) if purge else self.store.revoke_key(kid)
        out["sessions"] += sessions
        for jid in out.get("stopping", []):
            self.jobs.cancel(jid)
        return out

    def prompt(self, row: dict) -> Any:
        """The loaded prompt for a store row, built on its backbone. LRU cache: 256 prompts, of
        which at most 4 LoRA / full ones (each of those holds a whole copy of the backbone).
        Files that are missing or damaged give 503 and nothing is cached, so restoring them
        is enough."""
        with self._prompt_lock:
            if row["id"] in self._prompts:
                self._prompts.move_to_end(row["id"])
                return self._prompts[row["id"]]
        try:
            obj = self.prompt_loader(Path(row["path"]))
            if hasattr(obj, "build"):  # tensors that load but do not fit fail here, not later
                obj.build(self.backbones[row["backbone"]])
        except Exception as e:
            log.warning("prompt %s cannot be loaded from %s: %s: %s", row["id"], row["path"],
                        type(e).__name__, e)
            raise ServiceError(503, "prompt_unavailable",
                               f"prompt '{row['id']}' cannot be loaded: its stored files are "
                               "missing or damaged (the server log says which). Retry once "
                               "the operator has restored them, or tune it again") from None
        with self._prompt_lock:
            self._prompts[row["id"]] = obj
            while len(self._prompts) > 256:
                self._prompts.popitem(last=False)
            heavy = [k for k, p in self._prompts.items()
                     if getattr(getattr(p, "config", None), "method", "prompt")
                     in ("lora", "full")]
            for k in heavy[:-4]:
                del self._prompts[k]
        return obj

    def channel_info(self, backbone: str) -> dict | None:
        """What responses say of the channel model loaded for ``backbone`` (None: none)."""
        ch = self.channels.get(backbone)
        return ch.info if ch is not None else None

    def recorded_channel(self, kind: str, row: dict, recorded: dict | None) -> Channel | None:
        """The channel model a stored job or prompt was tuned with (None: none); 409 when this
        server no longer holds it, as `rapt predict` refuses a missing or other channel."""
        what = f"{kind} '{row['id']}'"
        try:
            return recorded_channel(self.channels, row["backbone"], recorded, what)
        except LookupError as e:
            raise ServiceError(409, "channel_unavailable",
                               f"{e}: its rows must be read back by the same channel model. "
                               f"The operator can restart the server with --channel "
                               f"{row['backbone']}=FOLDER of that model; or tune a new "
                               "prompt") from None

    def forget_prompt(self, prompt_id: str) -> None:
        with self._prompt_lock:
            self._prompts.pop(prompt_id, None)

    def row_limit(self, backbone: str, prompt_tokens: int = 0) -> tuple[int, str]:
        """The longest row accepted for ``backbone`` under a prompt that takes
        ``prompt_tokens`` positions, and the words naming that limit in an error."""
        limit, why = self.limits.max_seq_len, f"max_seq_len={self.limits.max_seq_len}"
        pos = backbone_positions(self.backbones[backbone])
        if pos is not None and pos - prompt_tokens < limit:
            limit = pos - prompt_tokens
            why = f"{limit} tokens (backbone '{backbone}' has {pos} positions"
            why += (f", of which the prompt's {prompt_tokens} virtual tokens take "
                    f"{prompt_tokens})" if prompt_tokens else ")")
        return limit, why

    def check_rows(self, backbone: str, rows: list[list[int]], field: str,
                   max_rows: int, max_rows_name: str, prompt_tokens: int = 0) -> None:
        """Row count, length and vocabulary checks for token id rows."""
        if len(rows) > max_rows:
            raise ServiceError(422, "limit_exceeded",
                               f"{field} has {len(rows)} rows; the limit is "
                               f"{max_rows_name}={max_rows}")
        vocab = int(self.backbones[backbone].embeddings.shape[0])
        max_len, why = self.row_limit(backbone, prompt_tokens)
        for i, row in enumerate(rows):
            if len(row) > max_len:
                raise ServiceError(422, "limit_exceeded",
                                   f"{field}[{i}] has {len(row)} tokens; the limit is {why}")
            if row and (min(row) < 0 or max(row) >= vocab):
                j = next(j for j, t in enumerate(row) if not 0 <= t < vocab)
                raise ServiceError(422, "invalid_token_id",
                                   f"{field}[{i}][{j}] = {row[j]} is not a token id of backbone "
                                   f"'{backbone}' (vocabulary size {vocab})")

    def rows_of(self, backbone: str, input_ids: list[list[int]] | None,
                texts: list[str] | None, max_rows: int, max_rows_name: str,
                prompt_tokens: int = 0, text_pairs: list[str] | None = None
                ) -> list[list[int]]:
        """Checked token id rows, tokenizing (privatized) texts, or sentence pairs, with the
        backbone's tokenizer as the user side does (rapt.tuning.reconstruction.encode_texts)."""
        from rapt.padding import dedicated_pad_id, strip_padding
        from rapt.tuning.reconstruction import encode_texts

        bb = self.backbones[backbone]
        if texts is not None:
            if len(texts) > max_rows:
                raise ServiceError(422, "limit_exceeded", f"texts has {len(texts)} rows; the "
                                   f"limit is {max_rows_name}={max_rows}")
            input_ids = encode_texts(bb.tokenizer, texts, text_pairs)
            empty = _special_only(input_ids, bb.special_ids)
            if empty is not None:
                raise ServiceError(422, "validation_error", f"texts[{empty}]: no token is left "
                                   "once tokenized (the tokenizer drops every character)")
            self.check_rows(backbone, input_ids, "texts (tokenized)", max_rows, max_rows_name,
                            prompt_tokens)
            return input_ids
        # Rows a client padded to a length bucket (rapt.padding): checked as sent, pads
        # included, so padding cannot carry a row past the limits; then the real rows only.
        self.check_rows(backbone, input_ids, "input_ids", max_rows, max_rows_name,
                        prompt_tokens)
        empty = _special_only(input_ids, bb.special_ids)
        if empty is not None:  # as a blank text is refused: nothing of it is text
            raise ServiceError(422, "validation_error", f"input_ids[{empty}] holds only special "
                               f"or pad tokens ({input_ids[empty][:8]}); a row needs at least "
                               "one token of text")
        return strip_padding(input_ids, dedicated_pad_id(bb.tokenizer))

    def backbone_name(self, name: str) -> str:
        if name not in self.backbones:
            raise ServiceError(422, "unknown_backbone",
                               f"backbone '{name}' is not loaded here; available: "
                               f"{', '.join(self.backbones)}")
        return name

    def require_backbone(self, kind: str, row: dict) -> None:
        """503 when a stored object needs a backbone this process did not load."""
        if row["backbone"] not in self.backbones:
            raise ServiceError(503, "backbone_unavailable",
                               f"{kind} '{row['id']}' needs backbone '{row['backbone']}', which "
                               "this server did not load (start it with --backbone for it)")


def _special_only(rows: list[list[int]], special_ids: list[int]) -> int | None:
    """The index of the first row made only of special (and pad) ids, or None."""
    special = set(special_ids)
    return next((i for i, r in enumerate(rows) if all(t in special for t in r)), None)
