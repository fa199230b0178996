"""User-side client of the provider service: privatizes on the device, sends only that.

Everything that leaves the machine is privatized token ids (dχ-privacy text-to-text, RAPT
§3.1), integer labels, the public plain tokens used for reconstruction, and the declared
mechanism metadata (η, embedding, search mode). Raw text never does; original token ids only
where the policy passes a class in clear (the default's frequent public words).
Without a configured policy an upload is privatized by kind of token, rapt's default
(:func:`rapt.privacy.by_kind.default_policy`: rare words at η for P ≈
:data:`rapt.privacy.rule.DEFAULT_PROTECTED_P` without a configured η, personal data and words
outside the 10,000 most frequent public words at η 0, frequent words in clear);
``kind_policy=KindPolicy()`` noises every token alike (P ≈
:data:`rapt.privacy.rule.DEFAULT_TARGET_P` by default). It sends clear text only with
``no_privacy=True``.

    c = RaptClient("http://127.0.0.1:8000", key, backbone="minilm")
    ds = c.upload("reviews.csv")           # by kind; η calibrated for P ≈ 0.7 on public text
    job = c.tune(ds)                       # TuneConfig's defaults (rapt.config): LoRA
    status = c.wait(job)                   # progress bar (rapt.progress)
    out = c.predict(status["prompt_id"], ["a private query"])  # the training data's η
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from rapt.config import DEFAULT_PLAIN_TOKENS, DEFAULT_PRIVATIZER_MODE, eta_problem
from rapt.http import HttpSession, ServiceError, warn_plain_http

# DEFAULT_MIN_P: the one weak-privacy threshold (re-exported)
from rapt.privacy.rule import DEFAULT_MIN_P, DEFAULT_PROTECTED_P, DEFAULT_TARGET_P

# imported where used: rapt.pipeline brings torch, `import rapt.client.client` not
if TYPE_CHECKING:
    from rapt.pipeline import Customization

# ServiceError: rapt.http's, kept importable here
__all__ = ["ClientError", "Prediction", "PrivacyNotConfiguredError", "PrivacyWarning",
           "RaptClient", "ServiceError", "WeakPrivacyWarning"]


class ClientError(RuntimeError):
    """A problem on the user's side (configuration, input) found before anything was sent."""


class PrivacyNotConfiguredError(ClientError):
    pass


class PrivacyWarning(UserWarning):
    """Weak or no privacy on data about to leave (or that just left) this machine."""


class WeakPrivacyWarning(PrivacyWarning):
    """The weak-privacy rule (:mod:`rapt.privacy.rule`) flagged what was just measured; the CLI
    prints it after the privacy lines, as every command does."""




@dataclass
class Prediction:
    """What the service answered (label ids, probabilities in label-id order) with what stays
    here: the label names (recorded at upload on this machine, or given), the query texts and
    the gold labels of a labelled query file."""

    labels: list[int]
    probabilities: list[list[float]]
    label_names: list[str] | None = None
    texts: list[str] | None = None
    text_pairs: list[str | None] | None = None
    gold: list[int | None] | None = None
    # the probabilities are the prompt's head on pooled states corrected here by its output
    # denoiser (the service's own probabilities were not used)
    denoised: bool = False
    # with ``denoised``: the service's own probabilities, as it returned them
    remote_probabilities: list[list[float]] | None = None
    # the rows as privatized and sent (before any padding), kept on this machine
    sent: list[list[int]] | None = None

    @property
    def label_strings(self) -> list[str] | None:
        return [self.label_names[i] for i in self.labels] if self.label_names else None


def _cache_root() -> Path:
    return Path(os.environ.get("RAPT_CACHE") or Path.home() / ".cache" / "rapt")


def _write_0600(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _subset(ds: Any, idx: Sequence[int]) -> Any:
    """The rows ``idx`` of a ``rapt.data.Dataset``, in that order."""
    from rapt.data import Dataset

    return Dataset(ds.name, [ds.examples[int(i)] for i in idx], list(ds.label_names),
                   ds.source, dict(ds.report))


def _named(backbone: Any) -> str | None:
    """A backbone argument as `client tune` can load it again from anywhere: a folder's
    absolute path, a name as it is (None: an object)."""
    if not isinstance(backbone, str | Path):
        return None
    return str(Path(backbone).resolve()) if Path(backbone).exists() else str(backbone)


def _read_denoiser(doc: dict, prompt_id: str) -> tuple[Any, Any, dict]:
    """(OutputDenoiser, task head, the denoiser's document) from the service's
    ``GET /v1/prompts/{id}/output-denoiser`` answer; ClientError when it does not decode."""
    import base64
    import hashlib

    from safetensors.torch import load

    from rapt.local.denoise import OutputDenoiser
    from rapt.tuning.heads import head_from_tensors

    try:
        data = base64.b64decode(doc["tensors"], validate=True)
        if hashlib.sha256(data).hexdigest() != doc["sha256"]:
            raise ValueError("its tensors do not match their SHA-256")
        tensors = load(data)
        meta, head = doc["denoiser"], doc["head"]
        den = OutputDenoiser(int(meta["hidden"]), int(meta["width"]))
        den.load_state_dict({k[len("denoiser."):]: v for k, v in tensors.items()
                             if k.startswith("denoiser.")})
        task = head_from_tensors(head["kind"], tensors, temperature=head.get("temperature"))
    except Exception as e:  # noqa: BLE001 - base64, safetensors and torch raise their own
        raise ClientError(f"prompt {prompt_id}: the output denoiser the service sent cannot "
                          f"be used ({type(e).__name__}: {e}); predict without it "
                          "(--no-denoise)") from e
    return den.eval(), task, meta


def rows_digest(ds: Any) -> str:
    """SHA-256 of a dataset's texts, pair texts and labels: tells whether a file read again
    still holds the rows uploaded from it (kept on this machine; it is not sent)."""
    import hashlib

    doc = json.dumps([ds.texts, ds.text_pairs, [e.label for e in ds.examples],
                      list(ds.label_names)], ensure_ascii=False)
    return hashlib.sha256(doc.encode()).hexdigest()


# The weak-privacy warning names a release as the CLI's commands do.
RELEASE_NAMES = {"upload": "training data", "predict": "query set"}


class _JobBars:
    """A job's progress as :meth:`RaptClient.wait` polls it: a bar over its training steps
    (loss to 4 significant digits; rate and time left are the bar's, measured here), then a
    bar of its own for each stage after training, whose steps take another time each."""

    def __init__(self, job_id: str) -> None:
        self.job_id, self.bar, self.stage = job_id, None, None

    def show(self, st: dict) -> None:
        from rapt.numfmt import loss

        stage = st.get("stage") or None
        if stage is not None:
            name = str(stage["name"]).replace("_", " ")
            if name != self.stage:  # training (or the stage before) is over
                self._finish()
                self.stage = name
                self._open(stage["total"], stage["done"], f"job {self.job_id}: {name}")
            self._advance(stage["done"])
        elif self.stage is None:  # still training
            if self.bar is None and st.get("total_steps"):
                self._open(st["total_steps"], st.get("step") or 0, f"job {self.job_id}")
            if self.bar is not None and st.get("loss") is not None:
                self.bar.set_postfix(loss=loss(st["loss"]), refresh=False)
            self._advance(st.get("step") or 0)
        if st.get("state") == "succeeded":
            self._finish()

    def _open(self, total: int, done: int, desc: str) -> None:
        from rapt.progress import progress_bar

        # a job already under way: its bar starts where it is, its rate is this wait's
        self.bar = progress_bar(total=total, desc=desc, unit="step", initial=done)

    def _advance(self, done: int) -> None:
        if self.bar is not None and done > self.bar.n:
            self.bar.update(done - self.bar.n)

    def _finish(self) -> None:
        """The open bar at its end (the job went past it), closed."""
        if self.bar is not None:
            self._advance(self.bar.total or 0)
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class RaptClient:
    """Talks to a rapt service; ``backbone`` is the local copy (tokenizer + embeddings) of the
    model the service hosts, used only to tokenize and privatize on this machine.
    ``pad_to_bucket`` (tokens): pad every row sent to a multiple of it (``rapt.padding``;
    hides lengths from the traffic, not from the provider). ``progress``: a bar on stderr
    while rows are privatized and while they are sent (:meth:`wait` has its own switch)."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *,
                 backbone: Any = "minilm", remote_backbone: str | None = None,
                 eta: float | None = None, target_p: float | None = None,
                 no_privacy: bool = False, mode: str = DEFAULT_PRIVATIZER_MODE,
                 seed: int | None = None, plain_tokens: int | Sequence[int] = DEFAULT_PLAIN_TOKENS,
                 min_p: float = DEFAULT_MIN_P, timeout: float = 120.0,
                 pad_to_bucket: int | None = None, progress: bool = False,
                 kind_policy: Any = None, http: httpx.Client | None = None) -> None:
        url = url or os.environ.get("RAPT_URL")
        api_key = api_key or os.environ.get("RAPT_API_KEY")
        if not url and http is None:
            raise ClientError("no service URL: pass --url or set RAPT_URL")
        if not api_key:
            raise ClientError("no API key: pass --key or set RAPT_API_KEY")
        if url and http is None:
            warn_plain_http(url, PrivacyWarning, stacklevel=2)
        if eta is not None and eta_problem(eta):
            raise ClientError(f"eta {eta_problem(eta)}")
        if target_p is not None and not 0 < target_p < 1:
            raise ClientError(f"target_p must lie strictly between 0 and 1, got {target_p}")
        if eta is not None and target_p is not None:
            raise ClientError("give either eta= or target_p=, not both")
        if (eta is not None or target_p is not None) and no_privacy:
            raise ClientError("give either eta= (or target_p=) or no_privacy=True, not both")
        if not 0.0 <= min_p <= 1.0:
            raise ClientError(f"min_p must lie in [0, 1], got {min_p}")
        if pad_to_bucket is not None and (isinstance(pad_to_bucket, bool) or not isinstance(
                pad_to_bucket, int) or pad_to_bucket < 1):
            raise ClientError(f"pad_to_bucket must be an integer >= 1 (tokens), got "
                              f"{pad_to_bucket!r}")
        # Rows go up padded to a multiple of this many tokens (rapt.padding): the wire shows
        # length buckets, not lengths; the provider, which must mask the padding, still does.
        self.pad_to_bucket = pad_to_bucket
        # bars on stderr (rapt.progress) while rows are privatized and sent, as the CLI shows
        self.progress = progress
        self.eta, self.no_privacy, self.mode, self.seed = eta, no_privacy, mode, seed
        # η given (or calibrated from target_p) by the user wins; otherwise predict uses the η
        # the service recorded with the prompt's training data.
        self.target_p = target_p
        self._eta_chosen = eta is not None or target_p is not None
        # rapt.privacy.by_kind.KindPolicy: the noise by kind of token (None: not chosen; upload
        # then takes rapt's default, predict the policy the prompt's data was declared with)
        self.kind_policy, self.kind_source = kind_policy, "given" if kind_policy else None
        self._kind_chosen = kind_policy is not None
        self.eta_source = "given" if eta is not None else None
        self.min_p = float(min_p)
        if seed is not None:
            warnings.warn(f"privatization noise seeded with {seed}: anyone who knows the seed can "
                          "undo it (no privacy guarantee); use for tests only", PrivacyWarning,
                          stacklevel=2)
        # What the last upload / predict sent, measured here and kept here (P is a statistic
        # of the private text): n_tokens, replacement_probability, inversion_success, ...
        self.last_privacy: dict[str, Any] = {}
        self._backbone_arg = backbone
        self._backbone: Any = None if isinstance(backbone, str) else backbone
        self.remote_backbone = remote_backbone or (
            backbone if isinstance(backbone, str) else backbone.name)
        self._plain_arg = plain_tokens
        # The privatizer at self.eta (rapt.pipeline's); None until needed, reset when η changes.
        self._custom: Customization | None = None
        # rapt.http's session (errors, retries); self.http is its httpx.Client.
        self.api = HttpSession(url, api_key, timeout=timeout, client=http)
        self.http = self.api.client
        self._prompt_info: dict[str, dict] = {}
        self._denoisers: dict[str, tuple[Any, Any, dict]] = {}
        self.last_upload: dict[str, Any] = {}
        # Whether the held-out rows' answer was sent for, or read from this machine's record
        self.last_heldout: dict[str, Any] = {}

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> RaptClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- local side ---------------------------------------------------------------------------
    @property
    def backbone(self) -> Any:
        if self._backbone is None:
            from rapt.models import load_backbone

            self._backbone = load_backbone(self._backbone_arg)
        return self._backbone

    def _default_target(self) -> float:
        """The P a level is calibrated for when none was given: the protected tokens' default
        under noise by kind, the uniform default otherwise."""
        by_kind = self.kind_policy is not None and not self.kind_policy.uniform
        return DEFAULT_PROTECTED_P if by_kind else DEFAULT_TARGET_P

    def _take_default_policy(self) -> None:
        """An upload without a chosen policy takes rapt's default (noise by kind of token),
        as `rapt client upload` does; η calibrated for the uniform default is dropped."""
        if self._kind_chosen or self.no_privacy or self.kind_source == "default":
            return
        from rapt.privacy.by_kind import default_policy

        self.kind_policy, self.kind_source, self._custom = default_policy(), "default", None
        if self.eta_source == "default":
            self.eta = None

    def _check_privacy(self) -> None:
        """Without an η, calibrate one: for ``target_p``, or for the default level
        (:meth:`_default_target`); clear text only with ``no_privacy``."""
        if self.eta is None and not self.no_privacy:
            target = self.target_p if self.target_p is not None else self._default_target()
            # Calibrated as every command calibrates (rapt.pipeline); its privatizer is kept.
            custom = self._create(target_p=target)
            self._set_eta(custom.eta, "target_p" if self.target_p is not None else "default")
            self._custom = custom

    def resolved_eta(self) -> float | None:
        """The η uploads are privatized at (calibrated now for ``target_p`` or the default
        level when none was given); None with ``no_privacy``."""
        self._check_privacy()
        return None if self.no_privacy else self.eta

    def set_kind_policy(self, policy: Any, source: str = "given") -> None:
        """Privatize by kind of token under ``policy`` (a KindPolicy; ``KindPolicy()``:
        uniform, also for the queries of a prompt tuned by kind)."""
        self.kind_policy, self.kind_source, self._kind_chosen = policy, source, True
        self._custom = None

    def _set_eta(self, eta: float, source: str) -> None:
        if eta != self.eta:
            self.eta, self._custom = float(eta), None
        self.eta_source = source

    def _measure(self, rows: list[list[int]], private: list[list[int]], what: str,
                 plain: Sequence[int] | None = None, *, texts: Sequence[str] | None = None,
                 text_pairs: Sequence[str | None] | None = None) -> dict:
        """η, P and the nearest-neighbour inversion success on what is about to be sent
        (:meth:`rapt.pipeline.Customization.measure`), over the text positions (the plain
        tokens ``plain`` are public), and per kind of token when the rows' ``texts`` are given;
        warns when P is below ``min_p``. The result stays on this machine (``last_privacy``)."""
        from rapt.pipeline import Encoding

        layout = Encoding(None, list(plain) if plain else None)
        report: dict[str, Any] = {"what": what, "rows": len(rows), "eta": self.eta,
                                  "eta_source": self.eta_source, "no_privacy": self.no_privacy,
                                  "min_p": self.min_p}
        if self.no_privacy:
            text = layout.text_only(self.backbone.tokenizer, rows)
            report.update(replacement_probability=0.0, inversion_success=1.0,
                          n_tokens=sum(len(r) for r in text))
        else:
            custom = replace(self.customization, encoding=layout)
            classes = (None if texts is None
                       else custom.kind_noise(rows, list(texts), text_pairs)[2])
            report.update(custom.measure(rows, private, classes=classes))
            report["kind_policy"] = self._declaration().get("by_kind")  # the policy, not counts
            from rapt.privacy.rule import weak_privacy_warning

            # The rule every command applies (rapt.privacy.rule): table and measured recovery.
            msg = weak_privacy_warning(report, backbone=self.backbone.name, min_p=self.min_p,
                                       what=RELEASE_NAMES.get(what, what))
            if msg is not None:
                warnings.warn(msg, WeakPrivacyWarning, stacklevel=3)
        self.last_privacy = report
        return report

    @property
    def customization(self) -> Customization:
        """The local backbone's :class:`rapt.pipeline.Customization` at the client's η (no
        privatizer without one); rebuilt when η changes."""
        if self._custom is None:
            custom = self._create(eta=self.eta)
            # The P that η was calibrated for, reported beside the measured P.
            target = self._default_target() if self.eta_source == "default" else self.target_p
            custom.target_p = target if custom.privatizer is not None else None
            self._custom = custom
        return self._custom

    def _create(self, **level: Any) -> Customization:
        """The Customization at ``level`` (eta= or target_p=) with the kind policy; a policy
        whose unprotected η lies below the protected one is a ClientError."""
        from rapt.pipeline import Customization

        try:
            return Customization.create(self.backbone, noise_seed=self.seed,
                                        privatizer_mode=self.mode, kind_policy=self.kind_policy,
                                        **level)
        except ValueError as e:
            raise ClientError(f"noise by kind of token ({self.kind_source}): {e}") from None

    @property
    def privatizer(self) -> Any:
        """The dχ privatizer at the client's η (None without one)."""
        return self.customization.privatizer if self.eta is not None else None

    def plain_ids(self) -> list[int]:
        """The public plain tokens k (RAPT §3.2.2): arbitrary, so they carry nothing private."""
        if isinstance(self._plain_arg, int):
            from rapt.tuning.reconstruction import sample_plain_tokens

            return list(sample_plain_tokens(self.backbone.tokenizer, self._plain_arg, seed=0))
        return [int(t) for t in self._plain_arg]

    def _rows(self, texts: Sequence[str], pairs: Sequence[str | None] | None,
              plain: Sequence[int] | None, max_length: int, *,
              queries: bool = False) -> list[list[int]]:
        """Token id rows ``[leading specials] k x [trailing specials]``
        (rapt.tuning.reconstruction's layout, sentence pairs included;
        :class:`rapt.pipeline.Encoding`)."""
        from rapt.pipeline import Encoding

        layout = Encoding(max_length, list(plain) if plain else None)
        return layout.rows(self.backbone.tokenizer, list(texts), pairs, queries=queries)

    def privatize(self, rows: list[list[int]], texts: Sequence[str] | None = None,
                  text_pairs: Sequence[str | None] | None = None) -> list[list[int]]:
        """Apply the mechanism to every non-special token (identity with no_privacy); a bar
        with ``progress``. ``texts`` (and ``text_pairs``): what the rows were built from; a
        by-kind policy needs them to classify the tokens."""
        self._check_privacy()
        if self.no_privacy:
            warnings.warn("no_privacy=True: your text's token ids are about to be sent to the "
                          "provider unprotected", PrivacyWarning, stacklevel=3)
            return [list(r) for r in rows]
        if self.customization.by_kind and texts is None:
            raise ClientError("noise by kind of token needs the texts the rows were built from "
                              "(privatize(rows, texts=...)); nothing was sent")
        with self._bar(len(rows), "privatize") as bar:
            return self.customization.privatize(rows, measure=False,
                                                progress=bar.update if self.progress else None,
                                                texts=texts, text_pairs=text_pairs)

    def _timed(self, desc: str) -> Any:
        """:func:`rapt.progress.timed` with ``progress`` (a step with its clock), else nothing."""
        import contextlib

        from rapt.progress import timed

        return timed(desc) if self.progress else contextlib.nullcontext()

    def _bar(self, total: int, desc: str) -> Any:
        """A :mod:`rapt.progress` bar of ``total`` rows (a silent one without ``progress``)."""
        from rapt.progress import progress_bar

        return progress_bar(total=total, desc=desc, unit="row", disable=not self.progress)

    def encode(self, texts: Sequence[str], *, text_pairs: Sequence[str | None] | None = None,
               plain_ids: Sequence[int] | None = None, max_length: int = 128
               ) -> list[list[int]]:
        """Texts -> privatized token id rows (what upload and predict send)."""
        return self.privatize(self._rows(list(texts), text_pairs, plain_ids, max_length),
                              list(texts), text_pairs)

    def _padded(self, rows: list[list[int]]) -> list[list[int]]:
        """Rows as they are sent: padded to ``pad_to_bucket`` when it is set."""
        if self.pad_to_bucket is None:
            return rows
        from rapt.padding import dedicated_pad_id, pad_to_bucket

        pad = dedicated_pad_id(self.backbone.tokenizer)
        if pad is None:
            raise ClientError("pad_to_bucket needs a pad token that is no other special token "
                              f"(backbone {self.remote_backbone!r} has pad token "
                              f"{self.backbone.tokenizer.pad_token!r}); the service could not "
                              "tell padding from the row's own tokens")
        return pad_to_bucket(rows, pad, self.pad_to_bucket)

    def _declaration(self) -> dict[str, Any]:
        """What the upload declares: mechanism, η, embedding, search mode and the by-kind
        policy. Nothing measured on the rows (P, per-kind privacy) leaves the machine: those
        are statistics of the private text; the console shows the attack table's figures."""
        if self.no_privacy:
            return {"mechanism": "none"}
        # The service's name for the backbone (not a local path, which could name the user).
        out = {"mechanism": "dchi-text2text", "eta": self.eta,
               "embedding": self.remote_backbone, "nn_mode": self.mode}
        rec = self.customization.kind_record()
        if rec is not None:  # the policy and each class's η only: no statistic of the rows
            out["by_kind"] = {k: rec[k] for k in ("protect", "frequent_rank", "class_eta",
                                                  "eta_personal", "personal_rank") if k in rec}
        return out

    # -- HTTP (rapt.http.HttpSession: errors as ServiceError) -----------------------------------
    def upload(self, source: str | Path | Any, *, text_column: str | None = None,
               text_pair_column: str | None = None, label_column: str | None = None,
               label_names: Sequence[str] | None = None, limit: int | None = None,
               reconstruction: bool = False, max_length: int = 128,
               holdout: bool = True, holdout_seed: int = 0,
               reload: dict[str, Any] | None = None) -> str:
        """Read a labelled file (or take a ``rapt.data.Dataset``), privatize it here, upload
        the privatized ids; returns the dataset id. ``reconstruction`` prepends the plain
        tokens k to every row before privatization (RAPT §3.2.2).

        ``holdout``: keep :func:`rapt.local.holdout_split`'s slice (``holdout_seed``; 20 %, at
        most 500 rows, none below about 100 rows) on this machine, never uploaded, so that
        :meth:`user_side` can score the tuned prompt on rows it never trained on. What
        identifies the rows is recorded here (:meth:`holdout_record`): how to read the file
        again (``reload``: load_dataset's arguments; taken from ``source`` when it is a path),
        a digest of the rows and the held-out indices, never the text. Without a chosen
        ``kind_policy`` the rows are privatized under rapt's default policy."""
        self._take_default_policy()
        self._check_privacy()
        if isinstance(source, str | Path):
            from rapt.data import load_dataset

            reload = {"name_or_path": str(Path(source).resolve()) if Path(source).exists()
                      else str(source), "text_column": text_column,
                      "text_pair_column": text_pair_column, "label_column": label_column,
                      "label_names": label_names, "limit": limit}
            ds = load_dataset(**reload)
        else:
            ds = source
        labels = ds.labels  # raises DataError naming the line of an unlabelled example
        if not labels:
            raise ClientError(f"{getattr(ds, 'source', source)}: no examples to upload")
        full, held = ds, []
        if holdout:
            from rapt.local import holdout_split

            keep, held = (i.tolist() for i in holdout_split(labels, holdout_seed))
            if held:  # the held-out rows stay here: only the others are uploaded
                ds, labels = _subset(ds, keep), [labels[i] for i in keep]
        plain = self.plain_ids() if reconstruction else None
        rows = self._rows(ds.texts, ds.text_pairs, plain, max_length)
        private = self.privatize(rows, ds.texts, ds.text_pairs)
        p = self._measure(rows, private, "upload", plain, texts=ds.texts,
                          text_pairs=ds.text_pairs)["replacement_probability"]
        num_labels = max(len(ds.label_names), max(labels) + 1, 2)
        body = {"backbone": self.remote_backbone, "input_ids": self._padded(private),
                "labels": labels,
                "num_labels": num_labels, "privacy": self._declaration(), "plain_ids": plain}
        info = self.api.call("POST", "/v1/datasets", body)
        # Kept on this machine only: P is a statistic of the private data.
        self.last_upload = {"dataset_id": info["id"], "n": len(rows),
                            "replacement_probability": p, "label_names": list(ds.label_names)}
        self.remember_label_names(info["id"], list(ds.label_names))
        if holdout:  # also with no row held out: the local model is then fitted by CV alone
            self.last_upload["held_out"] = len(held)
            self._remember("holdout", info["id"], {
                "reload": reload, "digest": rows_digest(full), "n": len(full),
                "held": held, "holdout_seed": holdout_seed, "max_length": max_length,
                "backbone": _named(self._backbone_arg)})
        return info["id"]

    # -- the user's side: records on this machine, never sent ---------------------------------
    def _user_side_file(self) -> Path:
        return _cache_root() / "user-side.NOT-PRIVATE.json"

    def _remember(self, kind: str, key: str, value: Any) -> None:
        """Record ``value`` under (service, ``kind``, ``key``) in this machine's user-side
        file (0600); a warning if it cannot."""
        path = self._user_side_file()
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        doc[f"{kind}|{self._label_key(key)}"] = value
        try:
            _write_0600(path, json.dumps(doc))
        except OSError as e:
            warnings.warn(f"could not record the {kind} of {key} in {path} ({e}): the local "
                          "model cannot be fitted or found without it", stacklevel=3)

    def _recalled(self, kind: str, key: str) -> Any:
        try:
            doc = json.loads(self._user_side_file().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc.get(f"{kind}|{self._label_key(key)}") if isinstance(doc, dict) else None

    def holdout_record(self, dataset_id: str) -> dict | None:
        """What :meth:`upload` recorded here about the rows of ``dataset_id`` (how to read the
        file again, a digest of its rows, the held-out indices, maybe none); None when it was
        uploaded with ``holdout=False`` or from another machine."""
        rec = self._recalled("holdout", dataset_id)
        return rec if isinstance(rec, dict) else None

    def dataset_of(self, prompt_id: str) -> str | None:
        """The id of the dataset ``prompt_id`` was tuned on (None once its job is gone)."""
        try:
            return self.status(self.prompt(prompt_id)["job_id"])["dataset_id"]
        except ServiceError:
            return None

    def heldout_rows(self, dataset_id: str) -> tuple[Any, list[int]] | None:
        """(every row as uploaded plus the held-out ones, held-out indices), read again from
        the file named at upload; None without a record. ClientError when the file is gone or
        its rows changed since the upload (the digest differs)."""
        rec = self.holdout_record(dataset_id)
        if rec is None:
            return None
        if not rec.get("reload"):
            raise ClientError(f"dataset {dataset_id} was uploaded from data in memory: pass its "
                              "rows to user_side(data=...)")
        from rapt.data import DataError, load_dataset

        try:
            ds = load_dataset(**rec["reload"])
        except (DataError, OSError) as e:
            raise ClientError(f"cannot read the rows of dataset {dataset_id} again: {e}") from e
        if rows_digest(ds) != rec["digest"]:
            raise ClientError(f"{rec['reload']['name_or_path']}: its rows changed since dataset "
                              f"{dataset_id} was uploaded; no local model fitted")
        return ds, [int(i) for i in rec["held"]]

    def user_side(self, prompt_id: str, data: Any = None, held: Sequence[int] | None = None,
                  *, seed: int = 0) -> tuple[Any, Any, Any]:
        """After a tune: the held-out rows privatized and classified as :meth:`predict`
        classifies queries (one predict call, nothing else sent), then
        :func:`rapt.local.fit_user_side` on the clean rows here ->
        (LocalBaseline, Fusion or None, Comparison). ``data`` / ``held``: the rows and held-out
        indices (default: those recorded at upload; ClientError when none were)."""
        from rapt.local import fit_user_side

        if data is None:
            dataset_id = self.dataset_of(prompt_id)
            got = self.heldout_rows(dataset_id) if dataset_id else None
            if got is None:
                raise ClientError(f"no held-out rows recorded on this machine for prompt "
                                  f"{prompt_id}'s dataset (uploaded elsewhere, or with "
                                  "holdout off)")
            data, held = got
        held = [] if held is None else [int(i) for i in held]
        remote = self._heldout_answer(prompt_id, _subset(data, held)) if held else None
        with self._timed("local model: fitting on your clean rows"):
            return fit_user_side(data.texts, data.labels,
                                 int(self.prompt(prompt_id)["num_labels"]),
                                 np.asarray(held, dtype=np.int64), remote,
                                 text_pairs=data.text_pairs, seed=seed)

    def _heldout_answer(self, prompt_id: str, part: Any) -> np.ndarray:
        """The prompt's probabilities (N, C) on the held-out rows ``part``, which go out once.
        A file here (``$RAPT_CACHE/held-out/<digest of the rows>.NOT-PRIVATE.json``, 0600)
        keeps the rows as first privatized and sent, and each prompt's answer: asked again for
        a prompt (`client local` after `client tune --wait`), the stored answer is used and
        nothing is sent; for another prompt, the same privatized rows go out again as they
        were (no fresh noise: nothing new about the rows is released). ``last_heldout`` says
        which."""
        path = _cache_root() / "held-out" / f"{rows_digest(part)[:32]}.NOT-PRIVATE.json"
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        answers = doc.setdefault("answers", {})
        key = self._label_key(prompt_id)
        if isinstance(answers.get(key), dict):
            self.last_heldout = {"sent": False, "fresh": False, "file": str(path)}
            return np.asarray(answers[key]["probabilities"], dtype=float)
        try:
            pred = self.predict(prompt_id, part.texts, text_pairs=part.text_pairs,
                                released=doc.get("release"))
        except ClientError as e:
            if doc.get("release") is None:
                raise
            raise ClientError(f"held-out rows: {e} (to release them again knowingly, delete "
                              f"{path})") from e
        self.last_heldout = {"sent": True, "fresh": "release" not in doc, "file": str(path)}
        doc.setdefault("release", {"eta": self.eta, "no_privacy": self.no_privacy,
                                   "rows": pred.sent})
        answers[key] = {"probabilities": pred.probabilities, "denoised": pred.denoised}
        doc["warning"] = ("the held-out rows as privatized and sent, and the answers to them: "
                          "statistics of your rows, keep local")
        try:
            _write_0600(path, json.dumps(doc))
        except OSError as e:
            warnings.warn(f"could not record the held-out rows' answer in {path} ({e}): "
                          "asking again would send them again", stacklevel=3)
        return np.asarray(pred.probabilities, dtype=float)

    def _released(self, clear: list[list[int]], released: dict) -> list[list[int]]:
        """The privatized rows of an earlier release of the rows ``clear``, to send again as
        they were; ClientError, before anything is sent, when they cannot stand for them."""
        rows = [[int(t) for t in r] for r in released.get("rows") or []]
        if (released.get("eta"), bool(released.get("no_privacy"))) != (self.eta,
                                                                        self.no_privacy):
            raise ClientError(f"these rows were sent once at η = {released.get('eta')}; sending "
                              f"them at η = {self.eta} would release them a second time")
        if [len(r) for r in rows] != [len(r) for r in clear]:
            raise ClientError("the rows sent before do not fit these rows' layout (another "
                              "max_length or plain tokens); sending them again would release "
                              "them a second time")
        return rows

    def local_model_path(self, prompt_id: str) -> Path:
        """Where the local model of ``prompt_id`` lives on this machine: where
        :meth:`remember_local_model` recorded it, else ``$RAPT_CACHE/local/<prompt>``
        (the files are ``<that>.local.NOT-PRIVATE.json`` / ``.safetensors``)."""
        rec = self._recalled("local-model", prompt_id)
        if isinstance(rec, str):
            return Path(rec)
        import hashlib

        tag = hashlib.sha256(str(self.http.base_url).encode()).hexdigest()[:8]
        return _cache_root() / "local" / f"{tag}-{prompt_id}"

    def remember_local_model(self, prompt_id: str, out: str | Path) -> None:
        self._remember("local-model", prompt_id, str(Path(out).resolve()))

    # -- label names: the service sees label ids only; their names stay on this machine -----
    def _labels_file(self) -> Path:
        return _cache_root() / "label-names.json"

    def _label_key(self, dataset_id: str) -> str:
        return f"{self.http.base_url}|{dataset_id}"

    def _label_record(self) -> dict:
        try:
            doc = json.loads(self._labels_file().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def remember_label_names(self, dataset_id: str, names: Sequence[str]) -> None:
        """Record an uploaded dataset's label names (in id order) on this machine, so that
        predictions of prompts tuned on it name their labels; a warning if it cannot."""
        path = self._labels_file()
        record = self._label_record()
        record[self._label_key(dataset_id)] = [str(n) for n in names]
        try:
            _write_0600(path, json.dumps(record))
        except OSError as e:
            warnings.warn(f"could not record the label names of dataset {dataset_id} in {path} "
                          f"({e}); give them to predict with label_names=", stacklevel=2)

    def label_names_for(self, prompt_id: str) -> list[str] | None:
        """The label names recorded here for the dataset ``prompt_id`` was tuned on (None: it
        was uploaded from another machine or before names were recorded)."""
        info = self.prompt(prompt_id)
        try:
            job = self.status(info["job_id"])
        except ServiceError:  # the job is gone (its prompt stays): no way to its dataset
            return None
        names = self._label_record().get(self._label_key(job["dataset_id"]))
        return list(names) if names and len(names) == int(info["num_labels"]) else None

    def tune(self, dataset_id: str, *, method: str | None = None,
             reconstruction: bool | None = None, output_denoiser: bool = False,
             **hyper: Any) -> str:
        """Create a tuning job; returns its id. ``reconstruction`` defaults to whether the
        dataset was uploaded with plain tokens. ``output_denoiser``: the job also fits the
        prompt's output denoiser on public text (:meth:`predict` then applies it here). Other
        keywords: lr, epochs, batch_size, num_virtual_tokens, max_length, seed, dp={...} (see
        the service's JobCreate); those left out or None take ``rapt.config.TuneConfig``'s
        defaults on the service."""
        if reconstruction is None:
            reconstruction = bool(self.dataset(dataset_id).get("plain_ids"))
        given = {k: v for k, v in {"method": method, **hyper}.items() if v is not None}
        if output_denoiser:  # left out otherwise: the request is what it was before
            given["output_denoiser"] = True
        job = self.api.call("POST", "/v1/jobs", {"dataset_id": dataset_id,
                                              "reconstruction": reconstruction, **given})
        return job["id"]

    def dataset(self, dataset_id: str) -> dict:
        return self.api.call("GET", f"/v1/datasets/{dataset_id}")

    def status(self, job_id: str) -> dict:
        return self.api.call("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict:
        return self.api.call("POST", f"/v1/jobs/{job_id}/cancel")

    def prompt(self, prompt_id: str) -> dict:
        if prompt_id not in self._prompt_info:
            self._prompt_info[prompt_id] = self.api.call("GET", f"/v1/prompts/{prompt_id}")
        return self._prompt_info[prompt_id]

    def output_denoiser(self, prompt_id: str) -> tuple[Any, Any, dict] | None:
        """(OutputDenoiser, the prompt's task head, the denoiser's document) that the job of
        ``prompt_id`` fitted on public text, downloaded once (checked against its SHA-256);
        None when the prompt has none. Nothing is sent but the request for it."""
        if not self.prompt(prompt_id).get("output_denoiser"):
            return None
        if prompt_id not in self._denoisers:
            self._denoisers[prompt_id] = _read_denoiser(
                self.api.call("GET", f"/v1/prompts/{prompt_id}/output-denoiser"), prompt_id)
        return self._denoisers[prompt_id]

    def wait(self, job_id: str, *, progress: bool = True, poll_s: float = 0.5,
             timeout: float | None = None) -> dict:
        """Poll until the job ends; a bar (:mod:`rapt.progress`) shows its steps, loss, rate
        and time left, then one for a stage after training (the output denoiser's fit)."""
        t0 = time.monotonic()
        bars = _JobBars(job_id) if progress else None
        try:
            while True:
                st = self.status(job_id)
                if bars is not None:
                    bars.show(st)
                if st["state"] in ("succeeded", "failed", "cancelled"):
                    return st
                if timeout is not None and time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"job {job_id} still {st['state']} after {timeout} s")
                time.sleep(poll_s)
        finally:
            if bars is not None:
                bars.close()

    def predict(self, prompt_id: str, texts: Sequence[str] | str | Path | Any, *,
                text_pairs: Sequence[str | None] | None = None, max_length: int = 128,
                chunk: int = 256, text_column: str | None = None,
                text_pair_column: str | None = None,
                label_names: Sequence[str] | None = None, denoise: bool = True,
                released: dict | None = None,
                on_privatized: Callable[[dict], None] | None = None) -> Prediction:
        """Privatize each query here (fresh noise) and ask the service for labels. When the
        prompt has an output denoiser (and ``denoise``), the service is asked for the pooled
        states of the same privatized rows too, which are corrected here and read by the
        prompt's head (:meth:`output_denoiser`): those are the probabilities. A file's
        columns are read as ``upload`` reads them (sentence pairs detected or named), and its
        gold labels, if any, by the prompt's label names. Without an η (or target_p) given to
        the client, the queries get the η recorded with the prompt's training data. Label
        names: ``label_names``, else those recorded here at upload. ``released``: {eta,
        no_privacy, rows}, the same rows as privatized and sent before, sent again as they
        were instead of privatized afresh. ``on_privatized``: called with the privacy report
        (:attr:`last_privacy`) once the queries are privatized, before any is sent."""
        info = self.prompt(prompt_id)  # its rows' plain tokens
        self.query_eta(prompt_id)
        names = list(label_names) if label_names else self.label_names_for(prompt_id)
        gold = None
        if isinstance(texts, str | Path) and Path(texts).exists():
            from rapt.data import load_dataset

            texts = load_dataset(texts, text_column=text_column,
                                 text_pair_column=text_pair_column, label_names=names)
        if hasattr(texts, "texts"):
            ds = texts
            texts, text_pairs = ds.texts, ds.text_pairs
            if ds.report.get("label_source") is not None:
                names = names or list(ds.label_names)
                gold = [e.label for e in ds.examples]
        elif isinstance(texts, str):
            texts = [texts]
        plain = info.get("plain_ids")  # queries take the training rows' layout
        clear = self._rows(list(texts), text_pairs, plain, max_length, queries=True)
        rows = (self.privatize(clear, list(texts), text_pairs) if released is None
                else self._released(clear, released))
        self._measure(clear, rows, "predict", plain, texts=list(texts), text_pairs=text_pairs)
        den = self.output_denoiser(prompt_id) if denoise and not self.no_privacy else None
        width = int(self.backbone.embeddings.shape[1])
        if den is not None and den[0].hidden != width:  # before any query is sent
            raise ClientError(f"prompt {prompt_id}'s output denoiser reads states of width "
                              f"{den[0].hidden}, the local backbone's are {width}: use the "
                              "service's backbone here (--backbone), or --no-denoise")
        if on_privatized is not None:
            on_privatized(self.last_privacy)
        sent = self._padded(rows)
        labels, probs, raw = [], [], []
        with self._bar(len(sent), f"predict (prompt {prompt_id})") as bar:
            for i in range(0, len(sent), chunk):
                body = {"prompt_id": prompt_id, "input_ids": sent[i:i + chunk]}
                if den is not None:  # the one field more: the states its head reads
                    body["return_pooled"] = True
                out = self.api.call("POST", "/v1/predict", body)
                if den is not None:
                    p = self._denoised(den, out["pooled"], clear[i:i + chunk],
                                       rows[i:i + chunk])
                    labels += p.argmax(-1).tolist()
                    probs += p.tolist()
                    raw += out["probabilities"]
                else:
                    labels += out["labels"]
                    probs += out["probabilities"]
                bar.update(len(body["input_ids"]))
        return Prediction(labels, probs, names, list(texts), text_pairs, gold,
                          denoised=den is not None, remote_probabilities=raw if den else None,
                          sent=rows)

    def query_eta(self, prompt_id: str) -> float | None:
        """The η the queries of ``prompt_id`` are privatized at (None: no_privacy), and their
        noise by kind of token: the client's when given, else those the prompt's training data
        was declared with; a prompt without a recorded η gets the default level (warned)."""
        decl = self.prompt(prompt_id).get("privacy") or {}
        if not self._eta_chosen and not self.no_privacy:
            if decl.get("mechanism") == "dchi-text2text" and decl.get("eta"):
                self._set_eta(float(decl["eta"]), f"prompt {prompt_id}")
            else:
                if self.eta_source != "default":
                    self.eta, self._custom = None, None  # the default level, calibrated below
                why = (f"prompt {prompt_id} was tuned on unprivatized data" if decl
                       else f"the service recorded no η for prompt {prompt_id}")
                warnings.warn(f"{why}: its queries are privatized at the default level, P ≈ "
                              f"{DEFAULT_TARGET_P:g} (pass no_privacy=True to send them in "
                              "clear, as it was tuned)", PrivacyWarning, stacklevel=3)
        if not self._kind_chosen and not self.no_privacy:
            from rapt.privacy.by_kind import KindPolicy

            rec = decl.get("by_kind")
            policy = KindPolicy.from_record(rec) if rec else None
            if policy != self.kind_policy:
                self.kind_policy, self._custom = policy, None
            self.kind_source = f"prompt {prompt_id}" if policy else None
        self._check_privacy()
        return None if self.no_privacy else self.eta

    def _denoised(self, den: tuple[Any, Any, dict], pooled: list[list[float]],
                  clear: list[list[int]], private: list[list[int]]) -> Any:
        """Class probabilities (N, C) of privatized rows from the pooled states the service
        returned, corrected here: the token features of (clean, privatized) rows from the
        local embedding table (:func:`rapt.local.denoise.token_features`), the denoiser, then
        the prompt's head. Nothing of it is sent."""
        import torch

        denoiser, head, _ = den
        z = denoiser.correct(torch.tensor(pooled, dtype=torch.float32), self.backbone.embeddings,
                             clear, private, [int(t) for t in self.backbone.special_ids])
        with torch.no_grad():
            return head.from_pooled(z).float().softmax(-1)

    # -- SAP split training ---------------------------------------------------------------------
    def sap_bottom(self, split_layer: int, *, cache_dir: str | Path | None = None
                   ) -> dict[str, Any]:
        """The provider's bottom for ``split_layer`` (tensors by name), downloaded once and
        cached under ``cache_dir`` (default ``$RAPT_CACHE`` or ~/.cache/rapt); its SHA-256 is
        checked against the service's ``X-Content-SHA256`` on every use."""
        import hashlib

        from safetensors.torch import load

        root = Path(cache_dir or os.environ.get("RAPT_CACHE") or
                    Path.home() / ".cache" / "rapt") / "sap-bottoms"
        # One file per server, backbone and split (the remote name may be a path).
        tag = hashlib.sha256(f"{self.http.base_url}|{self.remote_backbone}|{split_layer}"
                             .encode()).hexdigest()[:24]
        path = root / f"{tag}.safetensors"
        cached = path.read_bytes() if path.is_file() else None
        headers = {}
        if cached is not None:
            headers["If-None-Match"] = f'"{hashlib.sha256(cached).hexdigest()}"'
        r = self.api.request("GET", "/v1/sap/bottom", headers=headers,
                          params={"backbone": self.remote_backbone, "split_layer": split_layer})
        want = r.headers.get("x-content-sha256", "")
        data = cached if r.status_code == 304 else r.content
        if data is None or hashlib.sha256(data).hexdigest() != want:
            raise ClientError(f"the bottom for split_layer={split_layer} does not match its "
                              f"SHA-256 ({want or 'missing'}): damaged download or cache "
                              f"({path}); nothing was used")
        if r.status_code != 304:
            root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return load(data)

    def sap_customer(self, config: Any, num_labels: int, *,
                     cache_dir: str | Path | None = None) -> Any:
        """A :class:`rapt.split.SplitCustomer` on the provider's downloaded bottom (the local
        backbone gives the tokenizer and the architecture). Refuses an unprivatized release
        unless the client was made with ``no_privacy=True``."""
        from rapt.split import make_customer, split_backbone

        if config.eta is None and not self.no_privacy:
            raise PrivacyNotConfiguredError(
                "refusing to send: SplitConfig.eta is not set, so the bottom's release would "
                "not be privatized; set eta (the default level is the η of P ≈ "
                f"{DEFAULT_TARGET_P:g}: rapt.privacy.mechanism.calibrate_eta_public(backbone, "
                f"{DEFAULT_TARGET_P:g})) or pass no_privacy=True explicitly")
        bb = self.backbone
        tensors = self.sap_bottom(config.split_layer, cache_dir=cache_dir)
        bottom, _ = split_backbone(bb, config.split_layer, pooling=config.pooling)
        try:
            bottom.load_state_dict(tensors, strict=True)
        except RuntimeError as e:
            raise ClientError(f"the provider's bottom does not fit the local backbone "
                              f"{self._backbone_arg!r}: {e}") from None
        return make_customer(bb, bottom, config, num_labels)

    def sap_session(self, config: Any, n_examples: int) -> str:
        """Create a split-training session from the provider's part of ``config``
        (``SplitConfig.provider_view``: no η, no noise seed, no labels); returns its id."""
        body = {"backbone": self.remote_backbone, "n_examples": int(n_examples),
                **config.provider_view()}
        return self.api.call("POST", "/v1/sap/sessions", body)["id"]

    def sap_status(self, session_id: str) -> dict:
        return self.api.call("GET", f"/v1/sap/sessions/{session_id}")

    def sap_provider(self, session_id: str, customer: Any = None, *,
                     retry_s: float = 120.0) -> Any:
        """A :class:`rapt.split.remote.RemoteProvider` for the session (``customer``: needed
        for training with a frozen bottom, whose batches are sent as row indices)."""
        from rapt.split.remote import RemoteProvider

        return RemoteProvider(self.api, session_id, customer, retry_s=retry_s)
