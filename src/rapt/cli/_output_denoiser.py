"""The user-side output denoiser in the commands: `rapt tune --output-denoiser` fits it on public
text with the tuned prompt and saves it inside OUT (it holds nothing private); `rapt predict`
runs the pooled states of the privatized queries through it before the prompt's head.

The work itself is rapt.pipeline.fit_output_denoiser and denoised_proba; this module prints,
saves and reads."""

from __future__ import annotations

from pathlib import Path

import typer

from rapt import numfmt
from rapt.cli._app import fail

OUTPUT_DENOISER_HELP = (
    "after tuning, fit a user-side output denoiser (Split-N-Denoise) on public text: the tuned "
    "prompt's states on public sentences, clean and privatized at this η, teach a small network "
    "to correct the state of a privatized query from what only you know (its clean tokens); "
    "saved inside --out (no private row goes into it) and used by `rapt predict` (350 s "
    "measured for MiniLM on 2 quiet CPU cores, 3,000 public sentences privatized twice; "
    "needs privatization and an encoder head)")
NO_DENOISE_HELP = ("use the remote probabilities as the prompt gives them, even when ARTIFACT "
                   "holds an output denoiser (`rapt tune --output-denoiser`)")


def check_output_denoiser(enabled: bool, no_privacy: bool, kind: str, cfg) -> None:
    """Before any work: the output denoiser corrects privatized queries' pooled states, so it
    needs privatization and a head that reads a pooled state (``cfg``'s on a ``kind``
    backbone)."""
    from rapt.tuning.tune import resolve_head

    if not enabled:
        return
    if no_privacy:
        fail("--output-denoiser corrects privatized queries: leave out --no-privacy (or the "
             "denoiser)")
    if resolve_head(kind, cfg) == "verbalizer":
        fail("--output-denoiser corrects the pooled state an encoder head reads; the verbalizer "
             "head of a causal LM reads none: leave --output-denoiser out")


def fit_and_save(custom, tuned, out: Path, dataset: str, seed: int):
    """Fit the output denoiser of ``tuned`` on the public corpus for ``dataset`` with a bar,
    save it inside ``out`` and print its held-out public error before / after and its time.
    -> the denoiser."""
    from rapt.artifacts import write_output_denoiser
    from rapt.pipeline import user_side as pipeline
    from rapt.progress import progress_bar

    try:
        corpus = pipeline.output_denoiser_corpus(dataset)
    except (OSError, ValueError) as e:
        fail(f"--output-denoiser: cannot read the public corpus it is fitted on: {e}")
    epochs = pipeline.OUTPUT_DENOISER_EPOCHS
    progress = _StageBars(epochs, progress_bar)
    try:
        den, rec = pipeline.fit_output_denoiser(custom, tuned, corpus, seed=seed,
                                                rows=pipeline.OUTPUT_DENOISER_ROWS,
                                                epochs=epochs, progress=progress)
    finally:
        progress.close()
    write_output_denoiser(out, den, rec)
    where = "GPU" if next(iter(custom.backbone.model.parameters())).is_cuda else "CPU"
    typer.echo(f"output denoiser (fitted on {rec['public_rows']} public sentences, each "
               f"privatized {rec['privatized_copies']}x at η = {numfmt.eta(rec['eta'])}; no "
               f"private row): held-out public error {rec['before']:.4g} -> {rec['after']:.4g} "
               f"(squared distance to the clean state), {numfmt.seconds(rec['seconds'])} on this "
               f"machine's {where}; saved inside {out} (output_denoiser.*, shareable)")
    return den


class _StageBars:
    """The output denoiser's ``progress(done, total)`` as two bars, each with its own rate:
    the public rows privatized and read by the prompt (seconds a step), then the network's
    ``epochs`` (a fraction of a second each). One bar over both would start at the slow
    rate and promise several times the real time."""

    def __init__(self, epochs: int, progress_bar) -> None:
        self.epochs, self.make, self.bar, self.base = epochs, progress_bar, None, 0

    def __call__(self, done: int, total: int) -> None:
        states = total - self.epochs  # the steps before the first epoch
        if self.bar is None:
            self.bar = self.make(total=states, desc="output denoiser: public states",
                                 unit="step")
        if done > states and self.base == 0:
            self.bar.update(states - self.bar.n)
            self.bar.close()
            self.bar = self.make(total=self.epochs, desc="output denoiser: fit", unit="epoch")
            self.base = states
        self.bar.update(done - self.base - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def after_tune(custom, tuned, o):
    """After `rapt tune` saved ``tuned`` to ``o.out``: with --output-denoiser fit and save its
    output denoiser (-> it), else remove one a former prompt left there (-> None)."""
    if o.output_denoiser:
        return fit_and_save(custom, tuned, o.out, o.data, o.seed)
    drop_stale(o.out)
    return None


def drop_stale(out: Path) -> None:
    """An output denoiser left in ``out`` belongs to the prompt saved there before: remove it."""
    from rapt.artifacts import remove_output_denoiser

    gone = remove_output_denoiser(out)
    if gone:
        typer.echo(f"removed the output denoiser of the prompt {out} held before "
                   f"({', '.join(p.name for p in gone)}); --output-denoiser fits one for this "
                   "prompt", err=True)


def for_queries(artifact: Path, eta: float | None, no_denoise: bool):
    """The output denoiser saved in ``artifact`` to run on privatized queries at ``eta``, or
    None (there is none, --no-denoise, or the queries are clear); says which. A denoiser that
    cannot be read is one error line."""
    from rapt.artifacts import ArtifactError, read_output_denoiser

    try:
        got = read_output_denoiser(artifact)
    except ArtifactError as e:
        fail(f"{e}; or predict without it with --no-denoise")
    if got is None:
        return None
    den, doc = got
    if no_denoise or eta is None:
        why = "--no-denoise" if no_denoise else "the queries are not privatized"
        typer.echo(f"output denoiser in {artifact} not used ({why}); a local model's fusion "
                   "weights from the same `rapt tune` were fitted on the denoised remote "
                   "probabilities", err=True)
        return None
    fitted = (doc.get("record") or {}).get("eta")
    typer.echo(f"remote probabilities: the prompt's pooled states of the privatized queries, "
               f"corrected on this machine by the output denoiser in {artifact} (fitted on "
               "public text), then its head; --no-denoise uses them as returned", err=True)
    if fitted is not None and abs(float(fitted) - eta) > 1e-6 * max(1.0, abs(eta)):
        typer.echo(f"warning: the output denoiser was fitted at η = {numfmt.eta(float(fitted))}; "
                   f"these queries are privatized at η = {numfmt.eta(eta)}: it may correct them "
                   "less well",
                   err=True)
    return den
