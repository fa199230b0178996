"""The user's side in the commands that tune (`rapt tune`, `rapt sap tune`): the rows held out
from the remote prompt, the local model and its comparison printed with the verdict, and the
local model saved beside OUT (mode 0600, never inside the folder one shares).

The work itself is rapt.pipeline.user_side_after_tune and rapt.local.fit_user_side; this
module only splits the loaded data, prints and saves."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import typer

LOCAL_HELP = ("also fit a local model on your clean rows (TF-IDF + logistic regression, on "
              "this machine: about 2 s for 500 rows on 2 cores, measured, more with more rows; "
              "nothing more leaves it): 20 % of the rows (at most "
              "500, none below about 100 rows) are held out from the remote prompt to compare "
              "the two and fit their fusion, which `rapt predict` then uses; saved beside --out, "
              "mode 0600")


# What `rapt predict` does by default in each mode the tune's verdict can choose.
MODE_WORDS = {"fused": "the two fused", "local": "the local model alone (nothing sent)",
              "remote": "the privatized model alone"}


def held_out(labels: list[int], seed: int, enabled: bool) -> np.ndarray:
    """Indices of the rows the remote prompt must not train on (empty when ``enabled`` is
    False or the data are too few): a function of the labels and the seed only, so a resumed
    run holds out the same rows."""
    from rapt.local import holdout_split

    return holdout_split(labels, seed)[1] if enabled else np.arange(0)


def without(ds, held: np.ndarray, seed: int):
    """``ds`` without the rows ``held`` (the rows the remote prompt trains on), its report's
    counts updated; ``ds`` itself when nothing is held out. A note says how many are kept."""
    if len(held) == 0:
        return ds
    drop = {int(i) for i in held}
    examples = [e for i, e in enumerate(ds.examples) if i not in drop]
    typer.echo(f"holding out {len(held)} of {len(ds)} rows (stratified, seed {seed}) to "
               "compare the privatized model with a local one; the prompt trains on the other "
               f"{len(examples)} (--no-local trains on every row)", err=True)
    return dataclasses.replace(ds, examples=examples, report={**ds.report,
                                                               "kept": len(examples)})


def pairs_of(ds) -> list[str | None] | None:
    """The second texts of a sentence-pair dataset, None for single texts."""
    return ds.text_pairs if ds.report.get("text_pair_column") else None


def echo_user_side(local, fusion, comparison, level: float | None | str = "unknown", *,
                   denoised: bool = False, predict_cmd: str = "rapt predict") -> None:
    """The local model's CV accuracy and CPU time, the held-out accuracies (remote, local,
    fused) when there was a slice (``denoised``: the remote ones through the output
    denoiser), each saying which rows it was measured on, the verdict sentence (naming
    ``predict_cmd``) and, given the release's ``level`` (its P; None: no privacy), what
    rapt's grid measured at that level."""
    from rapt.local import verdict
    from rapt.local.verdict import grid_note
    from rapt.numfmt import pct, seconds

    cv = (f"{pct(local.cv_accuracy)} by {local.folds}-fold cross-validation on them"
          if local.cv_accuracy is not None else
          "no cross-validated accuracy (a class has fewer than 2 rows)")
    typer.echo(f"local model (TF-IDF + logistic regression on your clean rows, C = {local.C:g}):"
               f" fitted on all {local.n_rows:,} rows in {seconds(local.fit_seconds)} on this "
               f"machine's CPU; {cv}")
    if fusion is not None:
        acc = fusion.accuracy or {}
        typer.echo(f"held out ({fusion.n_rows} rows the prompt never trained on, privatized as "
                   f"queries): accuracy remote{' (denoised)' if denoised else ''} "
                   f"{pct(acc['remote'])}, local {pct(acc['local'])} (fitted without these "
                   f"rows), fused {pct(acc['fused'])} (cross-fitted; fusion weights: remote "
                   f"{fusion.remote:g}, local {fusion.local:g}); `{predict_cmd}` uses: "
                   f"{MODE_WORDS[fusion.mode]}")
    text = verdict(comparison)
    if predict_cmd != "rapt predict":
        text = text.replace("`rapt predict", f"`{predict_cmd}")
    typer.echo(text)
    if level != "unknown":
        typer.echo(grid_note(level))


def release_level(custom) -> float | None:
    """The P a customization's release was calibrated for (or measured at); None: clean."""
    if custom.privatizer is None:
        return None
    report = custom.privacy or {}
    return custom.target_p if custom.target_p is not None else report.get(
        "replacement_probability")


def save_user_side(out: Path, local, fusion) -> None:
    """The local model (and fusion weights) beside ``out``, 0600; where they went."""
    from rapt.artifacts import write_local_model

    paths = write_local_model(out, local, fusion)
    typer.echo(f"local model saved beside it, not to be shared (its vocabulary holds your rows' "
               f"words): {', '.join(str(p) for p in paths)}")


LOCAL_FIT = "local model: fitting on your clean rows"


@contextlib.contextmanager
def _user_side_bars(n_held: int) -> Iterator[Callable[[int], None]]:
    """-> the ``progress(n)`` of :func:`rapt.pipeline.user_side_after_tune`: a bar over the
    ``n_held`` held-out rows privatized then scored by the prompt; once they are, the local
    model's fit with its clock (it reports no count), until the block ends."""
    from rapt.progress import progress_bar, timed

    with contextlib.ExitStack() as stack:
        if not n_held:
            stack.enter_context(timed(LOCAL_FIT))
            yield lambda n: None
            return
        bar = progress_bar(total=2 * n_held, desc="held-out rows: privatize, then score",
                           unit="row")
        stack.callback(bar.close)

        def progress(n: int) -> None:
            bar.update(n)
            if bar.n >= bar.total:
                bar.close()
                stack.enter_context(timed(LOCAL_FIT))

        yield progress


def tune_user_side(custom, ds, held: np.ndarray, out: Path, seed: int, *,
                   denoiser=None) -> None:
    """After a remote tune on ``ds`` without ``held``: score the prompt on the held-out rows
    privatized as queries (through the output ``denoiser``, when there is one, as `rapt
    predict` will), fit the local model on every row and the fusion on the slice, print the
    comparison and save it beside ``out``. A local model that cannot be fitted (a single
    class) is a warning: the prompt is already saved."""
    from rapt.pipeline import user_side_after_tune

    try:
        with _user_side_bars(len(held)) as progress:
            local, fusion, comp = user_side_after_tune(custom, ds.texts, ds.labels,
                                                       len(ds.label_names), held,
                                                       text_pairs=pairs_of(ds), seed=seed,
                                                       denoiser=denoiser, progress=progress)
    except ValueError as e:
        typer.echo(f"warning: no local model: {e}", err=True)
        return
    echo_user_side(local, fusion, comp, release_level(custom), denoised=denoiser is not None)
    save_user_side(out, local, fusion)


def fit_user_side_alone(ds, out: Path, seed: int, *, predict_cmd: str = "rapt predict") -> None:
    """The local model on every clean row of ``ds`` when no slice was held out from the remote
    model (its estimate is cross-validated): printed with the verdict (naming
    ``predict_cmd``) and saved beside ``out``; a warning instead when it cannot be fitted."""
    from rapt.local import fit_user_side
    from rapt.progress import timed

    try:
        with timed(LOCAL_FIT):
            local, fusion, comp = fit_user_side(ds.texts, ds.labels, len(ds.label_names),
                                                np.arange(0), None, text_pairs=pairs_of(ds),
                                                seed=seed)
    except ValueError as e:
        typer.echo(f"warning: no local model: {e}", err=True)
        return
    echo_user_side(local, fusion, comp, predict_cmd=predict_cmd)
    save_user_side(out, local, fusion)
