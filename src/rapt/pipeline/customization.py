"""One customization: privatize → rows → calibrate → index → tune → predict.

:class:`Customization` holds what ``rapt tune``, ``rapt predict`` and ``rapt demo`` used to
assemble by hand: the backbone, the privatizer (η, or the η calibrated for a target replacement
probability P on rapt's public text sample; the noise seed; the nearest-neighbour index mode),
the :class:`Encoding` (texts → token-id rows, the plain tokens k of reconstruction, sentence
pairs), the provider's channel model (optional, a :class:`rapt.channel.model.ChannelModel`: a
denoiser that reads privatized rows back before tuning and predict, "denoise-then-tune", or a
channel adapter that makes the backbone read them as clean text), the tuner config
(:class:`rapt.config.TuneConfig`), the artifact (:class:`rapt.tuning.tune.TunedPrompt`) and the
privacy report (η, measured P, nearest-neighbour inversion success).

It does no I/O: callers read files, print and save; progress goes to plain callables.

    c = Customization.create(bb, Encoding(128), TuneConfig(), target_p=0.6)
    rows = c.privatize(c.rows(texts), texts=texts)   # c.privacy: η, P, inversion success
    tuned = c.tune(rows, labels, num_labels)          # c.artifact
    q = c.for_artifact(tuned)
    probs = q.predict_proba(q.privatize(q.rows(queries, queries=True), texts=queries))

The texts go with the rows to :meth:`Customization.privatize`: under a by-kind
``kind_policy`` (:mod:`rapt.privacy.by_kind`) they decide each token's class.

With ``channel=denoiser`` the privatized rows are denoised inside :meth:`Customization.tune` and
:meth:`Customization.predict_proba` (text positions only: specials and plain tokens k stay as
released), and the privacy report adds the channel's own recovery on the release: the same
model is also an attacker at that η (where it recovers more than the others we ran, it sets
the upper bound on privacy). With ``channel=adapter`` (a
:class:`rapt.channel.adapter.ChannelAdapter`) the rows stay as released and
:attr:`Customization.reader`, the backbone with the adapter merged in, tunes and predicts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from rapt.channel.model import ChannelModel, channel_fingerprint
from rapt.config import DEFAULT_PRIVATIZER_MODE, TuneConfig

COLLAPSE_CHECK_ROWS = 1000  # training rows predicted after tuning to spot a collapse

PRIVATIZE_CHUNK = 256  # rows per privatize (or predict) call when progress is reported

PlainIds = list[int] | list[list[int]]

CHANNEL_NOTE = (
    "denoise-then-tune: the rows were read back by the provider's channel model, which is also "
    "an attacker at this η; the empirical privacy reported is against the stronger of it and "
    "nearest neighbour. Post-processing of the dχ release: the formal guarantee at η is "
    "unchanged.")


def plain_tokens_for(tokenizer, m: int, sequences: int, n_rows: int, seed: int):
    """(plain_ids, plain_index): one sequence for all rows, or ``sequences`` of them assigned
    to the rows uniformly at random (seeded). Test rows use sequence 0."""
    from rapt.tuning.reconstruction import sample_plain_tokens

    if sequences <= 1:
        return sample_plain_tokens(tokenizer, m, seed=seed), None
    seqs = sample_plain_tokens(tokenizer, m, seed=seed, num_sequences=sequences)
    g = torch.Generator().manual_seed(seed + 17)
    return seqs, torch.randint(sequences, (n_rows,), generator=g).tolist()


@dataclass
class Encoding:
    """Texts (or sentence pairs) → token-id rows ``[leading specials] k x [trailing specials]``
    (rapt.tuning.reconstruction's layout) of at most ``max_length`` ids, k included."""

    max_length: int | None = 128
    plain: PlainIds | None = None  # the public plain tokens k (or several sequences of m ids)
    plain_index: list[int] | None = None  # training row i's sequence, when there are several

    @classmethod
    def sampled(cls, tokenizer, max_length: int | None, m: int, sequences: int, n_rows: int,
                seed: int) -> Encoding:
        """Random plain tokens: ``sequences`` of m ids, one drawn per training row (seeded)."""
        plain, index = plain_tokens_for(tokenizer, m, sequences, n_rows, seed)
        return cls(max_length, plain, index)

    @classmethod
    def parsed(cls, tokenizer, max_length: int | None, text: str) -> Encoding:
        """Plain tokens given as text (e.g. RAPT Table 8's list); ValueError if empty."""
        from rapt.tuning.reconstruction import parse_plain_tokens

        return cls(max_length, parse_plain_tokens(tokenizer, text))

    @classmethod
    def of(cls, tuned: Any) -> Encoding:
        """The layout a tuned prompt was trained on (its queries use plain sequence 0)."""
        return cls(tuned.config.max_length, tuned.plain_ids)

    @property
    def plain_len(self) -> int:
        """m: plain tokens per row (0 without reconstruction)."""
        from rapt.tuning.reconstruction import _as_sequences

        seqs = _as_sequences(self.plain)
        return len(seqs[0]) if seqs else 0

    def rows(self, tokenizer, texts: Sequence[str],
             text_pairs: Sequence[str | None] | None = None, *,
             queries: bool = False) -> list[list[int]]:
        """Token-id rows; training rows take ``plain_index``'s sequences, ``queries`` (and
        rows without an index) sequence 0."""
        from rapt.tuning.reconstruction import _as_sequences, build_rows

        index = self.plain_index
        if len(_as_sequences(self.plain)) > 1 and (queries or index is None):
            index = [0] * len(texts)
        return build_rows(tokenizer, list(texts), self.max_length, self.plain, index,
                          text_pairs=text_pairs)

    def text_only(self, tokenizer, rows: Sequence[Sequence[int]]) -> list[list[int]]:
        """The same rows without k (the text positions: what P and inversion are about)."""
        from rapt.tuning.reconstruction import drop_plain

        m = self.plain_len
        return drop_plain(rows, tokenizer, m) if m else [list(r) for r in rows]


def make_privatizer(backbone: Any, eta: float | None = None, target_p: float | None = None, *,
                    noise_seed: int | None = None, mode: str = DEFAULT_PRIVATIZER_MODE):
    """The dχ privatizer at η, or at the η that gives P ≈ ``target_p`` on rapt's public text
    sample (the calibration every command uses); None when neither is given. Noise from OS
    entropy unless ``noise_seed`` (tests and benchmarks only: no guarantee)."""
    from rapt.privacy.mechanism import (
        Privatizer,
        calibrate_eta_public,
        candidate_ids_from_tokenizer,
    )

    if eta is not None and target_p is not None:
        raise ValueError("give eta or target_p, not both")
    if target_p is not None:
        eta = calibrate_eta_public(backbone, target_p)
    if eta is None:
        return None
    emb = backbone.embeddings.detach()  # the mechanism reads the table; no autograd graph
    # Outputs are real tokens only (no specials, no [unusedN] placeholders).
    cand = candidate_ids_from_tokenizer(backbone.tokenizer, emb.shape[0])
    return Privatizer(emb, float(eta), special_ids=backbone.special_ids,
                      candidate_ids=cand, mode=mode, seed=noise_seed)


@functools.lru_cache(maxsize=1)
def shared_detector() -> Any:
    """Presidio's personal-data detector with its defaults, built once per process (loading
    spaCy's model takes seconds; sibling customizations and every measure share it)."""
    from rapt.privacy.personal_data import PersonalDataDetector

    return PersonalDataDetector()


@dataclass
class Customization:
    """One customization of ``backbone``: privatizer, encoding, tuner config, artifact and
    privacy report. Siblings that share the privatizer (other configs or encodings, the
    queries of the artifact) come from :func:`dataclasses.replace` or :meth:`for_artifact`."""

    backbone: Any
    encoding: Encoding = field(default_factory=Encoding)
    config: TuneConfig | None = None
    privatizer: Any = None  # rapt.privacy.mechanism.Privatizer; None: rows stay clean
    target_p: float | None = None  # the P η was calibrated for (None: η given)
    noise_seed: int | None = None  # also seeds DP-SGD noise through config.dp
    privatizer_mode: str = DEFAULT_PRIVATIZER_MODE
    artifact: Any = None  # rapt.tuning.tune.TunedPrompt, once tuned (or loaded)
    privacy: dict | None = None  # privacy report of the last measured release
    # the provider's channel model: it prepares the privatized rows (see denoise) and gives the
    # backbone that reads them (see reader); None: the public backbone reads rows as released
    channel: ChannelModel | None = None
    # how the noise is spent by kind of token (rapt.privacy.by_kind); None or protect "all":
    # every token at η. Another policy needs the rows' texts in privatize().
    kind_policy: Any = None
    # text -> personal-data spans found ahead (rapt.privacy.by_kind.row_noise); None: Presidio
    # runs on the texts here (the detector is built once, on first use)
    personal_spans: Any = None
    _detector: Any = field(default=None, init=False, repr=False, compare=False)
    # (private rows, denoised rows) of the last denoise call: measure() and tune() share it.
    _denoised: tuple | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def create(cls, backbone: Any, encoding: Encoding | None = None,
               config: TuneConfig | None = None, *, eta: float | None = None,
               target_p: float | None = None, noise_seed: int | None = None,
               privatizer_mode: str = DEFAULT_PRIVATIZER_MODE,
               channel: ChannelModel | None = None, kind_policy: Any = None,
               personal_spans: Any = None) -> Customization:
        """Calibrate η for ``target_p`` (or take ``eta``) and build the privatizer; η is the
        protected classes' under a by-kind ``kind_policy``."""
        priv = make_privatizer(backbone, eta, target_p, noise_seed=noise_seed,
                               mode=privatizer_mode)
        if priv is not None and kind_policy is not None:
            kind_policy.check_against(priv.eta)
        return cls(backbone, encoding or Encoding(), config, priv,
                   target_p if priv is not None else None, noise_seed, privatizer_mode,
                   channel=channel, kind_policy=kind_policy, personal_spans=personal_spans)

    def for_artifact(self, tuned: Any) -> Customization:
        """Queries of ``tuned``: its row layout and config, this privatizer."""
        return replace(self, encoding=Encoding.of(tuned), config=tuned.config, artifact=tuned,
                       privacy=None)

    @classmethod
    def from_artifact(cls, backbone: Any, tuned: Any, *, eta: float | None,
                      noise_seed: int | None = None,
                      channel: ChannelModel | None = None,
                      kind_policy: Any = None) -> Customization:
        """Privatized queries of a loaded prompt at ``eta`` (None: clean), in the prompt's
        layout and privatizer mode, read back by ``channel`` if given (the caller checks it is
        the one the prompt was tuned with: :func:`rapt.channel.model.channel_fingerprint`);
        its calibration target is kept only at its own η. The noise by kind of token is the
        prompt's (its ``by_kind`` record) unless ``kind_policy`` says otherwise
        (``KindPolicy()``: uniform)."""
        from rapt.privacy.by_kind import KindPolicy

        mode = tuned.meta.get("privatizer_mode") or DEFAULT_PRIVATIZER_MODE
        if kind_policy is None and tuned.meta.get("by_kind") and eta is not None:
            kind_policy = KindPolicy.from_record(tuned.meta["by_kind"])
        custom = cls.create(backbone, noise_seed=noise_seed, privatizer_mode=mode, eta=eta,
                            channel=channel, kind_policy=kind_policy)
        trained = tuned.meta.get("privacy") or {}
        custom.target_p = trained.get("target_p") if trained.get("eta") == eta else None
        return custom.for_artifact(tuned)

    @property
    def reader(self) -> Any:
        """The backbone that tunes and predicts: the channel model's reader of :attr:`backbone`
        (a channel adapter's adapted copy), else :attr:`backbone`. The privatizer is always
        :attr:`backbone`'s: the mechanism is the customer's, on the public backbone."""
        if self.channel is not None:
            return self.channel.reader(self.backbone)
        return self.backbone

    @property
    def eta(self) -> float | None:
        return float(self.privatizer.eta) if self.privatizer is not None else None

    def rows(self, texts: Sequence[str], text_pairs: Sequence[str | None] | None = None, *,
             queries: bool = False) -> list[list[int]]:
        """Clean token-id rows in this customization's layout (see :meth:`Encoding.rows`)."""
        return self.encoding.rows(self.backbone.tokenizer, texts, text_pairs, queries=queries)

    @property
    def by_kind(self) -> bool:
        """True when the noise depends on the kind of token (a non-uniform kind policy)."""
        return (self.privatizer is not None and self.kind_policy is not None
                and not self.kind_policy.uniform)

    def kind_noise(self, rows: Sequence[Sequence[int]], texts: Sequence[str],
                   text_pairs: Sequence[str | None] | None = None) -> tuple:
        """(η scales, pass-in-clear masks, classes) of ``rows`` built from ``texts`` under
        :attr:`kind_policy` (see :func:`rapt.privacy.by_kind.row_noise`)."""
        from rapt.privacy.by_kind import KindPolicy, row_noise
        from rapt.tuning.reconstruction import plain_offset

        detector = None
        if self.personal_spans is None:
            if self._detector is None:
                self._detector = shared_detector()
            detector = self._detector
        start = plain_offset(self.backbone.tokenizer) + self.encoding.plain_len
        return row_noise(rows, texts, text_pairs, self.backbone.tokenizer,
                         self.kind_policy or KindPolicy(),
                         self.privatizer.eta, special=set(self._special_ids()), start=start,
                         detector=detector, spans=self.personal_spans)

    def privatize(self, rows: list[list[int]], *, measure: bool = True,
                  progress: Callable[[int], None] | None = None,
                  texts: Sequence[str] | None = None,
                  text_pairs: Sequence[str | None] | None = None) -> list[list[int]]:
        """Privatized rows (``rows`` as they are without a privatizer); with ``measure`` the
        privacy report goes to ``self.privacy``. ``progress(n)`` after each chunk of n rows
        (then the rows go in chunks of PRIVATIZE_CHUNK). With a by-kind policy the rows'
        ``texts`` (and ``text_pairs``) are required: they decide each token's class."""
        from rapt.tuning.reconstruction import privatize_rows

        if self.privatizer is None:
            return rows
        scales = clear = classes = None
        if self.by_kind and texts is None:
            raise ValueError("noise by kind of token needs the rows' texts to classify "
                             "their tokens (privatize(rows, texts=...))")
        if texts is not None and (self.by_kind or measure):
            scales, clear, classes = self.kind_noise(rows, texts, text_pairs)
            if not self.by_kind:
                scales = clear = None  # classes only to report privacy per kind
        step = len(rows) if progress is None else PRIVATIZE_CHUNK
        out = []
        for s in range(0, len(rows), max(step, 1)):
            part = slice(s, s + max(step, 1))
            out += privatize_rows(rows[part], self.privatizer,
                                  eta_scale=None if scales is None else scales[part],
                                  passthrough=None if clear is None else clear[part])
            if progress is not None:
                progress(len(rows[part]))
        if measure:
            self.measure(rows, out, classes=classes)
        return out

    def measure(self, clean: Sequence[Sequence[int]], private: Sequence[Sequence[int]], *,
                classes: Sequence[Sequence[int]] | None = None) -> dict:
        """The privacy report of a release (``rapt.privacy.mechanism.privacy_report``: η, P,
        inversion success, ...) on the text positions only: the plain tokens are public. With
        ``classes`` (each row position's class, :meth:`kind_noise`) also per kind of token
        (``by_kind``: all, rare, personal and frequent words)."""
        from rapt.privacy.mechanism import privacy_report

        tok, enc = self.backbone.tokenizer, self.encoding
        text_classes = None if classes is None else enc.text_only(tok, classes)
        rank = getattr(self.kind_policy, "frequent_rank", None)
        self.privacy = privacy_report(enc.text_only(tok, clean), enc.text_only(tok, private),
                                      self.privatizer, target_p=self.target_p,
                                      classes=text_classes, frequent_rank=rank)
        if self.channel is not None and self.channel.attacker is not None:
            self.privacy["channel"] = self._channel_privacy(clean, private, text_classes)
        if self.by_kind:  # the rule judges what the policy protects (rapt.privacy.rule)
            self.privacy["protected_kinds"] = self.kind_policy.protected_kinds(
                self.privatizer.eta)
        return self.privacy

    def _channel_privacy(self, clean: Sequence[Sequence[int]],
                         private: Sequence[Sequence[int]],
                         text_classes: Sequence[Sequence[int]] | None = None) -> dict:
        """The channel model as an attacker on this release: its token recovery over the text
        positions (all / replaced, and per kind with ``text_classes``), scored against
        ``clean``, which it never sees."""
        from rapt.attacks.recovery import token_recovery

        tok, enc = self.backbone.tokenizer, self.encoding
        denoised = self.denoise(private)
        text_clean, text_denoised = enc.text_only(tok, clean), enc.text_only(tok, denoised)
        rec = token_recovery(text_clean, enc.text_only(tok, private), text_denoised,
                             self._special_ids())
        nn = float((self.privacy or {}).get("inversion_success") or 0.0)
        # An undertrained channel can recover less than nearest neighbour: the honest figure
        # is the stronger of the two.
        name = self.channel.attacker
        out = {"attacker": name, "recovery": rec["all"],
               "recovery_replaced": rec["replaced"], "n_tokens": rec["n_all"],
               "strongest_attacker": name if rec["all"] >= nn else "nearest neighbour",
               "empirical_privacy": 1.0 - max(rec["all"], nn), "note": CHANNEL_NOTE}
        if text_classes is not None and (self.privacy or {}).get("by_kind"):
            out["by_kind"] = self._channel_by_kind(text_clean, text_denoised, text_classes)
        return out

    def _channel_by_kind(self, clean: Sequence[Sequence[int]],
                         denoised: Sequence[Sequence[int]],
                         classes: Sequence[Sequence[int]]) -> dict:
        """The channel model's recovery per kind (text positions); where it beats nearest
        neighbour, the report's per-kind empirical privacy and attacker become its."""
        from rapt.privacy.kind_recovery import recovery_by_class, with_attacker

        flat = [[int(t) for r in rows for t in r] for rows in (clean, denoised, classes)]
        per = recovery_by_class(*flat, self._special_ids())
        report = self.privacy["by_kind"]
        for kind, r in per.items():
            nn = report[kind]["inversion_success"]
            if r["recovery"] is not None and r["recovery"] > nn:
                report[kind].update(with_attacker(self.channel.attacker, r))
        return per

    def _special_ids(self) -> list[int]:
        ids = self.backbone.special_ids
        return [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]

    def _text_span(self, row: Sequence[int], special: set[int]) -> tuple[int, int]:
        """(start, end) of a row's text: after the leading specials and the plain tokens k,
        before the trailing specials (rapt.tuning.reconstruction's layout)."""
        from rapt.tuning.reconstruction import plain_offset

        start = min(len(row), plain_offset(self.backbone.tokenizer) + self.encoding.plain_len)
        end = len(row)
        while end > start and row[end - 1] in special:
            end -= 1
        return start, end

    def denoise(self, rows: Sequence[Sequence[int]]) -> list[list[int]]:
        """Privatized rows read back by the channel model (``rows`` as they are without one).
        Only the text positions go to ``channel.prepare_rows``; the specials and the plain
        tokens k (public, and the reconstruction loss's targets) stay as released."""
        rows = [[int(t) for t in r] for r in rows]
        if self.channel is None:
            return rows
        if self._denoised is not None and self._denoised[0] == rows:
            return [list(r) for r in self._denoised[1]]
        special = set(self._special_ids())
        spans = [self._text_span(r, special) for r in rows]
        text = self.channel.prepare_rows([r[a:b] for r, (a, b) in zip(rows, spans,
                                                                      strict=True)])
        out = [r[:a] + list(t) + r[b:] for r, (a, b), t in zip(rows, spans, text, strict=True)]
        self._denoised = (rows, out)
        return [list(r) for r in out]

    def channel_meta(self) -> dict | None:
        """What an artifact records of the channel model it was tuned with (None: none):
        its fingerprint, its provenance (backbone, public corpus, η band, P, recovery on
        held-out public text) and what it does to empirical privacy."""
        if self.channel is None:
            return None
        return {"fingerprint": channel_fingerprint(self.channel),
                "provenance": dict(self.channel.meta), "note": CHANNEL_NOTE}

    def tune(self, rows: list[list[int]], labels: list[int], num_labels: int, *,
             progress: Callable[[dict], None] | None = None,
             should_stop: Callable[[], bool] | None = None,
             checkpoint: Callable[[dict], None] | None = None,
             resume: dict | None = None) -> Any:
        """``rapt.tuning.tune.tune`` on (privatized) rows with this config and plain tokens; the
        TunedPrompt is kept as ``self.artifact`` and returned."""
        from rapt.tuning.tune import tune

        if self.config is None:
            raise ValueError("Customization.config is not set: no tuner config to tune with")
        rows = self.denoise(rows) if self.channel is not None else rows
        self.artifact = tune(self.reader, rows, labels, num_labels, self.config,
                             plain_ids=self.encoding.plain, plain_index=self.encoding.plain_index,
                             progress=progress, should_stop=should_stop, checkpoint=checkpoint,
                             resume=resume)
        # `rapt predict` loads the backbone by this name and the channel from --channel.
        self.artifact.meta["backbone"] = self.backbone.name
        return self.artifact

    def privacy_meta(self) -> dict:
        """What an artifact records of its training data's privatization."""
        on = self.privatizer is not None
        return {"eta": self.eta, "privatizer_mode": self.privatizer_mode if on else None,
                "seeded": self.noise_seed is not None, "privacy": self.privacy,
                "channel": self.channel_meta(), "by_kind": self.kind_record()}

    def kind_record(self) -> dict | None:
        """The by-kind policy as an artifact records it (each class's η), or None (uniform)."""
        if not self.by_kind:
            return None
        det = self._detector.record if self._detector is not None else (
            "spans given with the rows" if self.personal_spans is not None else None)
        return self.kind_policy.record(self.privatizer.eta,
                                       detector=det if isinstance(det, dict) else {"note": det})

    def predict_proba(self, rows: Sequence[Sequence[int]], *,
                      progress: Callable[[int], None] | None = None) -> Tensor:
        """Class probabilities (N, C) of the artifact for rows in its layout; ``progress(n)``
        after each chunk of n rows (then the rows go in chunks of PRIVATIZE_CHUNK)."""
        import torch

        if self.artifact is None:
            raise ValueError("Customization.artifact is not set: tune or load a prompt first")
        rows = self.denoise(rows) if self.channel is not None else rows
        if progress is None or not rows:
            return self.artifact.predict_proba(self.reader, rows)
        out = []
        for s in range(0, len(rows), PRIVATIZE_CHUNK):
            out.append(self.artifact.predict_proba(self.reader, rows[s:s + PRIVATIZE_CHUNK]))
            progress(len(out[-1]))
        return torch.cat(out)

    def predict(self, rows: Sequence[Sequence[int]]) -> list[int]:
        """Predicted label ids for rows in the artifact's layout."""
        return self.predict_proba(rows).argmax(-1).tolist()

    def training_check(self, rows: Sequence[Sequence[int]], labels: Sequence[int],
                       names: Sequence[str], max_rows: int = COLLAPSE_CHECK_ROWS, *,
                       progress: Callable[[int], None] | None = None) -> dict:
        """Predict (a seeded sample of at most ``max_rows``) training rows as trained on, after
        tuning: {"rows": n, "warnings": [...]} from :func:`rapt.stats.collapse_warnings`
        (near-constant predictions, or no better than the majority class). ``progress(n)``
        as rows are predicted."""
        import random

        from rapt.stats import collapse_warnings

        idx = list(range(len(rows)))
        if len(idx) > max_rows:
            idx = sorted(random.Random(0).sample(idx, max_rows))
        pred = self.predict_proba([rows[i] for i in idx], progress=progress).argmax(-1).tolist()
        return {"rows": len(idx),
                "warnings": collapse_warnings(pred, [labels[i] for i in idx], names)}
