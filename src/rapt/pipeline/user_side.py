"""The user's side after a remote tune (no I/O, nothing sent): the held-out rows scored as
queries and the local model and fusion fitted on them (:func:`user_side_after_tune`), and the
output denoiser the provider fits on public text for a tuned prompt (:func:`fit_output_denoiser`)
and the user applies to its privatized queries (:func:`denoised_proba`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from rapt.pipeline.customization import PRIVATIZE_CHUNK, Customization

if TYPE_CHECKING:
    from rapt.channel.corpus import ChannelCorpus
    from rapt.local.denoise import OutputDenoiser


def user_side_after_tune(custom: Customization, texts: Sequence[str], labels: Sequence[int],
                         num_labels: int, held: Any, *,
                         text_pairs: Sequence[str | None] | None = None, seed: int = 0,
                         denoiser: OutputDenoiser | None = None,
                         progress: Callable[[int], None] | None = None):
    """The user's side after a remote tune, on the clean rows it holds (no I/O, nothing sent):
    the held-out rows ``held`` (indices into ``texts``; the prompt in ``custom.artifact`` never
    trained on them) are privatized *as queries* -- the artifact's layout, this η, fresh noise,
    exactly as ``rapt predict`` does -- and scored by the prompt; then
    :func:`rapt.local.fit_user_side` fits the local model on every row and the fusion weights
    on the held-out ones. -> (LocalBaseline, Fusion or None, Comparison). With no held-out rows
    nothing is privatized, no fusion is fitted and the comparison is the local model's CV.
    With an output ``denoiser`` the slice's remote probabilities are the denoised ones, as
    ``rapt predict`` will fuse them. ``progress(n)`` as rows of the slice are privatized
    and then scored (2·len(held) in all)."""
    import numpy as np

    from rapt.local import fit_user_side

    held = np.asarray(held, dtype=np.int64)
    remote = None
    if len(held):
        remote = remote_proba(custom, [texts[int(i)] for i in held],
                              None if text_pairs is None else [text_pairs[int(i)] for i in held],
                              denoiser=denoiser, progress=progress)
    return fit_user_side(list(texts), np.asarray(labels, dtype=np.int64), num_labels, held,
                         remote, text_pairs=None if text_pairs is None else list(text_pairs),
                         seed=seed)


def remote_proba(custom: Customization, texts: Sequence[str],
                 text_pairs: Sequence[str | None] | None = None, *,
                 denoiser: OutputDenoiser | None = None,
                 progress: Callable[[int], None] | None = None):
    """The tuned prompt's class probabilities (numpy, float64, (N, C)) on clean ``texts``
    privatized as queries: the artifact's layout (plain sequence 0), ``custom``'s privatizer
    (fresh noise, not measured: the training release's report stays as it is); through the
    output ``denoiser`` when one is given (and the queries are privatized). ``progress(n)``
    after each chunk of rows privatized, then of rows scored (2·N in all; the N privatized
    at once without a privatizer)."""
    import numpy as np

    if custom.artifact is None:
        raise ValueError("Customization.artifact is not set: tune or load a prompt first")
    q = custom.for_artifact(custom.artifact)
    clean = q.rows(texts, text_pairs, queries=True)
    rows = q.privatize(clean, measure=False, progress=progress, texts=texts,
                       text_pairs=text_pairs)
    if progress is not None and q.privatizer is None:
        progress(len(rows))
    if denoiser is not None and q.privatizer is not None:
        probs = denoised_proba(q, q.artifact, denoiser, clean, rows)
        if progress is not None:
            progress(len(rows))
    else:
        probs = q.predict_proba(rows, progress=progress)
    return np.asarray(probs.detach().float().cpu().numpy(), dtype=np.float64)


# ------------------------------------------------------------------ the output denoiser

OUTPUT_DENOISER_ROWS = 3000  # public sentences the output denoiser is fitted on
OUTPUT_DENOISER_COPIES = 2  # privatized copies of each
OUTPUT_DENOISER_EPOCHS = 60


def output_denoiser_corpus(dataset: str) -> ChannelCorpus:
    """The public corpus an output denoiser for a prompt tuned on ``dataset`` is fitted on
    (a :class:`rapt.channel.corpus.ChannelCorpus`): the built-in families other than a built-in
    dataset's own, every built-in family for a user's file."""
    from rapt.channel.corpus import public_corpus_for, task_family

    try:
        task_family(dataset)
    except ValueError:
        return public_corpus_for("user")
    return public_corpus_for(dataset)


OUTPUT_DENOISER_CHUNK = 500  # rows per pooled-state pass when progress is reported


def _pooled(q: Customization, rows: Sequence[Sequence[int]],
            step: Callable[[], None] | None = None) -> Tensor:
    """The prompt's pooled states (what its head reads) on rows as the provider reads them
    (through the channel model, when there is one); ``step()`` after each chunk of
    :data:`OUTPUT_DENOISER_CHUNK` rows when given."""
    rows = q.denoise(rows) if q.channel is not None else rows
    if step is None:
        return q.artifact.pooled(q.reader, rows)
    out = []
    for s in range(0, len(rows), OUTPUT_DENOISER_CHUNK):
        out.append(q.artifact.pooled(q.reader, rows[s:s + OUTPUT_DENOISER_CHUNK]))
        step()
    return torch.cat(out) if out else q.artifact.pooled(q.reader, rows)


def _public_sample(public: ChannelCorpus | Sequence[str], rows: int,
                   seed: int) -> tuple[list[str], dict]:
    """(at most ``rows`` of the public texts, seeded, in corpus order; the corpus record)."""
    import numpy as np

    texts = list(getattr(public, "texts", public))
    record = public.provenance() if hasattr(public, "provenance") else {
        "kind": "public text", "n_texts": len(texts)}
    rng = np.random.default_rng(seed)
    pick = sorted(rng.choice(len(texts), min(rows, len(texts)), replace=False))
    return [texts[int(i)] for i in pick], record


def fit_output_denoiser(custom: Customization, tuned: Any,
                        public_texts: ChannelCorpus | Sequence[str], *, seed: int = 0,
                        rows: int = OUTPUT_DENOISER_ROWS, epochs: int = OUTPUT_DENOISER_EPOCHS,
                        progress: Callable[[int, int], None] | None = None
                        ) -> tuple[OutputDenoiser, dict]:
    """Fit a user-side output denoiser (:class:`rapt.local.denoise.OutputDenoiser`) for
    ``tuned`` on public text only: ``rows`` of ``public_texts`` (texts, or a ChannelCorpus whose
    provenance is recorded), encoded as queries, their pooled states clean and privatized
    :data:`OUTPUT_DENOISER_COPIES` times at ``custom``'s η; the network learns to map (privatized
    state, token features) to the clean state. -> (denoiser, record: what it was trained on,
    η, rows, held-out error before and per epoch, seconds). ``progress(done, total)`` after
    each chunk of rows privatized (:data:`PRIVATIZE_CHUNK`) or read
    (:data:`OUTPUT_DENOISER_CHUNK`) and each epoch. No private row is read."""
    import time

    from rapt.local.denoise import fit_denoiser, token_features

    if custom.privatizer is None:
        raise ValueError("an output denoiser corrects privatized queries: this customization "
                         "privatizes nothing (give it an η)")
    t0, q = time.perf_counter(), custom.for_artifact(tuned)
    texts, record = _public_sample(public_texts, rows, seed)
    chunks = -(-len(texts) // OUTPUT_DENOISER_CHUNK)
    # privatizing a copy is reported by chunk too: in one step it was the slowest of all
    priv_chunks = -(-len(texts) // PRIVATIZE_CHUNK)
    total = (1 + OUTPUT_DENOISER_COPIES) * chunks + OUTPUT_DENOISER_COPIES * priv_chunks + epochs
    done = 0

    def step(n: int = 1) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    clean = q.rows(texts, queries=True)
    z_clean = _pooled(q, clean, step)
    zp, feats = [], []
    for _ in range(OUTPUT_DENOISER_COPIES):
        priv = q.privatize(clean, measure=False, progress=lambda _: step(), texts=texts)
        zp.append(_pooled(q, priv, step))
        feats.append(token_features(q.backbone.embeddings, clean, priv, q._special_ids()))
    dev = next(iter(q.backbone.model.parameters())).device
    den, fit = fit_denoiser(torch.cat(zp), torch.cat(feats),
                            z_clean.repeat(OUTPUT_DENOISER_COPIES, 1), seed=seed, epochs=epochs,
                            device=dev, progress=step)
    return den, {"trained_on": record, "public_rows": len(texts),
                 "privatized_copies": OUTPUT_DENOISER_COPIES, "eta": q.eta,
                 "privatizer_mode": q.privatizer_mode, "backbone": q.backbone.name,
                 # the kept network's error: the best epoch, or the identity it starts as
                 "hidden": den.hidden, "seed": seed, "before": fit.before,
                 "after": min([fit.before, *fit.after]), "curve": fit.after,
                 "seconds": round(time.perf_counter() - t0, 3)}


@torch.no_grad()
def denoised_proba(custom: Customization, tuned: Any, denoiser: OutputDenoiser,
                   clean_rows: Sequence[Sequence[int]], private_rows: Sequence[Sequence[int]],
                   *, with_raw: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Class probabilities (N, C) of ``tuned`` on privatized queries, corrected on the user's
    side: the provider's pooled states of ``private_rows``, the token features of
    (``clean_rows``, ``private_rows``) from the embedding table the user privatizes with, the
    denoiser, then the prompt's head. ``with_raw``: (those, the head's on the uncorrected
    states: the prompt's own probabilities), from one pass of the backbone."""
    q = custom.for_artifact(tuned)
    z = _pooled(q, private_rows)
    den = tuned.head_proba(q.reader, denoiser.correct(z, q.backbone.embeddings, clean_rows,
                                                      private_rows, q._special_ids()))
    return (den, tuned.head_proba(q.reader, z)) if with_raw else den
