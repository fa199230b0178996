"""Stages shared by `rapt tune`, `rapt predict`, `rapt demo` and `rapt attack attribute`: the
Customization at a privacy level, privatizing with a bar, the channel model, step losses."""

from __future__ import annotations

from pathlib import Path

import typer

from rapt.cli._app import check_eta_options, fail, warn_if_seeded
from rapt.cli._by_kind import KindOptions, kind_policy


def customization(bb, eta: float | None, target_p: float | None, noise_seed: int | None,
                  mode: str, encoding=None, config=None, kinds: KindOptions | None = None):
    """The Customization at η (or at the η that gives P ≈ target on rapt's public text sample);
    its privatizer is None when neither is given. Its noise comes from OS entropy unless
    ``noise_seed`` is given (with a warning); by kind of token under ``kinds`` (--protect
    ...). Bad --eta/--target-p values and by-kind options exit 2."""
    from rapt.pipeline import Customization

    check_eta_options(eta, target_p)
    custom = Customization.create(bb, encoding, config, eta=eta, target_p=target_p,
                                  noise_seed=noise_seed, privatizer_mode=mode)
    if custom.privatizer is not None:
        warn_if_seeded(noise_seed)
    if kinds is not None:
        custom.kind_policy = kind_policy(bb, custom.eta, kinds)
    return custom


def privatize_with_bar(custom, rows, *, texts=None, text_pairs=None, measure: bool = True):
    """``custom.privatize`` with a progress bar on stderr, then (``measure``) its privacy
    report in ``custom.privacy`` with a clock: the nearest-neighbour inversion over every
    token takes a while of its own. ``texts`` (and ``text_pairs``): what ``rows`` were built
    from, which a by-kind policy classifies."""
    from rapt.progress import progress_bar, timed

    with progress_bar(total=len(rows), desc="privatize", unit="row") as bar:
        out = custom.privatize(rows, measure=False, progress=bar.update, texts=texts,
                               text_pairs=text_pairs)
    if measure and custom.privatizer is not None:
        # per kind of token too when the texts are known (their findings are kept from the
        # privatization: PersonalDataDetector.find)
        classes = None if texts is None else custom.kind_noise(rows, texts, text_pairs)[2]
        with timed("measure: P and nearest-neighbour inversion of what was privatized"):
            custom.measure(rows, out, classes=classes)
    return out


def load_channel(path: Path, bb):
    """The channel model saved by `rapt adapt` in ``path``, rebuilt on ``bb``; one error line
    when it cannot be (not a channel folder, another backbone, a causal backbone)."""
    from rapt.artifacts import ArtifactError
    from rapt.channel.load import load_channel_model

    try:
        return load_channel_model(path, bb)
    except (ArtifactError, ValueError) as e:
        fail(f"--channel {path}: {e}")


def echo_channel(privacy: dict | None, *, err: bool = False) -> None:
    """The channel model's recovery on this release, and the best of the attackers run."""
    ch = (privacy or {}).get("channel")
    if not ch:
        return
    from rapt.privacy.attack_table import ep_phrase

    typer.echo(f"channel: the channel model recovers {ch['recovery']:.1%} of the text tokens "
               f"({ch['recovery_replaced']:.1%} of the replaced ones); "
               f"{ep_phrase(ch['empirical_privacy'], ch['strongest_attacker'])}; "
               "post-processing, so the formal guarantee at η is unchanged", err=err)


def loss_postfix(r: dict) -> dict:
    """A step's losses for a bar: with reconstruction the task loss and L_rec apart (L_rec is
    summed over the m plain positions, ~100x the task loss), else the loss."""
    from rapt.numfmt import loss

    if r.get("rec_loss") is not None:
        return {"task": loss(r.get("task_loss", r["loss"])), "L_rec": loss(r["rec_loss"])}
    return {"loss": loss(r["loss"])}
