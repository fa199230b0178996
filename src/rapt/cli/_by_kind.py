"""Noise by kind of token on the command line (--protect, --frequent-rank, --other-p,
--other-eta, --personal-p, --personal-eta, --personal-rank; their definitions are in
:mod:`rapt.cli.options`):
the checks every command runs before any work, and the one function that builds the
:class:`rapt.privacy.by_kind.KindPolicy` at the command's η."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import typer

from rapt.cli._app import fail
from rapt.privacy.kinds import BAND_EDGES

# rapt.privacy.by_kind.PROTECT, DEFAULT_PROTECT and DEFAULT_PERSONAL_RANK; that module imports
# torch, which a check before work need not
PROTECT_CHOICES = ("all", "rare", "personal")
DEFAULT_PROTECT = "rare"
DEFAULT_PERSONAL_RANK = 10_000


@dataclass(frozen=True)
class KindOptions:
    """The options as typed. ``protect`` None: not given (:func:`with_defaults` fills in
    rapt's default; `rapt predict`: the artifact's policy, unless a personal-data level is
    given)."""

    protect: str | None = None
    frequent_rank: int = BAND_EDGES[1]
    other_p: float | None = None
    other_eta: float | None = None
    personal_p: float | None = None
    personal_eta: float | None = None
    personal_rank: int | None = None

    @classmethod
    def of(cls, options: Any) -> KindOptions:
        """The kind options among a command's options (an object with these attributes)."""
        return cls(**{f.name: getattr(options, f.name) for f in fields(cls)})

    @property
    def personal(self) -> bool:
        """A level of its own for personal data was given."""
        return self.personal_p is not None or self.personal_eta is not None


def with_defaults(o: KindOptions, *, private: bool = True) -> KindOptions:
    """The options with rapt's defaults filled in (the commands that privatize data they
    send or train on): --protect not given is ``rare`` (:data:`DEFAULT_PROTECT`), or ``all``
    with --no-privacy; under ``rare``, personal data without a level of its own gets
    --personal-p 1 (η 0: each personal token is swapped for a random one before the noise), and
    without --personal-rank the words outside the 10,000 most frequent public words get
    personal data's level (0 turns it off). Chosen from the grid in
    ``benchmarks/results/local_baseline_by_kind.md``, the per-kind privacy against the domain
    denoiser (``privacy_by_mechanism_denoiser.md``) and the planted names (canaries)."""
    protect = o.protect if o.protect is not None else (DEFAULT_PROTECT if private else "all")
    rare = protect == "rare" and private
    personal_p = 1.0 if rare and not o.personal else o.personal_p
    rank = DEFAULT_PERSONAL_RANK if rare and o.personal_rank is None else o.personal_rank
    return replace(o, protect=protect, personal_p=personal_p, personal_rank=rank)


def check_kind_options(o: KindOptions, *, private: bool = True) -> None:
    """Bad values exit 2 naming the option; cheap, before anything is loaded. ``private``:
    whether the command privatizes at all (not with --no-privacy)."""
    from rapt.config import eta_problem

    if o.protect is not None and o.protect not in PROTECT_CHOICES:
        fail(f"--protect must be one of {', '.join(PROTECT_CHOICES)} (got {o.protect!r})")
    if o.frequent_rank not in BAND_EDGES:
        fail(f"--frequent-rank must be one of {', '.join(map(str, BAND_EDGES))}, the band "
             f"edges of rapt's public word list (got {o.frequent_rank})")
    if o.other_p is not None and o.other_eta is not None:
        fail("give --other-p or --other-eta, not both")
    if o.other_p is not None and not 0 < o.other_p < 1:
        fail(f"--other-p must lie strictly between 0 and 1 (got {o.other_p})")
    if o.other_eta is not None and eta_problem(o.other_eta):
        fail(f"--other-eta {eta_problem(o.other_eta)}")
    other = "--other-p" if o.other_p is not None else "--other-eta"
    if (o.other_p is not None or o.other_eta is not None) and o.protect in (None, "all"):
        fail(f"{other} sets the noise of the unprotected tokens: give --protect rare or "
             "--protect personal with it (with --protect all every token gets the full noise)")
    if o.personal_p is not None and o.personal_eta is not None:
        fail("give --personal-p or --personal-eta, not both")
    if o.personal_p is not None and not 0 < o.personal_p <= 1:
        fail(f"--personal-p must lie in (0, 1] (got {o.personal_p}; 1: personal data's release "
             "does not depend on it)")
    if o.personal_eta is not None and o.personal_eta != 0 and eta_problem(o.personal_eta):
        fail(f"--personal-eta (0, or a dχ η) {eta_problem(o.personal_eta)}")
    if o.personal_rank is not None:
        _check_personal_rank(o, private)
    if not private and o.protect not in (None, "all"):
        fail(f"--protect {o.protect} noises tokens by kind: leave out --no-privacy")
    if not private and o.personal:
        fail("--personal-p / --personal-eta set personal data's noise: leave out --no-privacy")


def _check_personal_rank(o: KindOptions, private: bool) -> None:
    if o.personal_rank != 0 and (o.personal_rank not in BAND_EDGES
                                 or o.personal_rank < o.frequent_rank):
        fail(f"--personal-rank must be one of {', '.join(map(str, BAND_EDGES))} and at least "
             f"--frequent-rank ({o.frequent_rank}), or 0 (off) (got {o.personal_rank})")
    if not private:
        fail("--personal-rank sets the noise of rare words: leave out --no-privacy")
    if o.protect is None:  # only predict leaves it unset: it then takes the recorded policy
        fail("--personal-rank changes the policy: give --protect with it (without --protect, "
             "the prompt's recorded policy is used, its personal rank included)")
    if o.protect == "all" and not o.personal and o.personal_rank:
        fail("--personal-rank gives rare words personal data's noise, which under --protect "
             "all is every token's: give --personal-p or --personal-eta with it, or --protect "
             "rare")


def kind_policy(bb: Any, eta: float | None, o: KindOptions) -> Any:
    """The KindPolicy of the options at the protected η ``eta`` (None: uniform noise, or
    nothing privatized); the unprotected classes' η from --other-eta, or calibrated for
    --other-p on rapt's public text sample as --target-p is. An unprotected η below ``eta``
    exits 2 naming the option. The policy is printed on stderr."""
    from rapt.privacy.by_kind import KindLevelError, make_policy
    from rapt.privacy.mechanism import calibrate_eta_public

    check_kind_options(o)
    if eta is None or (o.protect in (None, "all") and not o.personal):
        return None
    try:
        policy = make_policy(eta, o.protect or "all", o.frequent_rank, other_p=o.other_p,
                             other_eta=o.other_eta, personal_p=o.personal_p,
                             personal_eta=o.personal_eta, personal_rank=o.personal_rank,
                             calibrate=lambda p: calibrate_eta_public(bb, p))
    except KindLevelError as e:
        _fail_level(bb, eta, o, e.level == "personal")
    echo_policy(policy, eta)
    return policy


def _fail_level(bb: Any, eta: float, o: KindOptions, personal: bool) -> None:
    """Exit 2: a class's level lies on the wrong side of the protected η."""
    from rapt.numfmt import eta as fmt
    from rapt.privacy.mechanism import calibrate_eta_public

    if personal:
        flag, p, given = "--personal", o.personal_p, o.personal_eta
    else:
        flag, p, given = "--other", o.other_p, o.other_eta
    level = calibrate_eta_public(bb, p) if p is not None else given
    said = f"{flag}-p {p:g} gives η = {fmt(level)}" if p is not None else \
        f"{flag}-eta {fmt(level)}"
    if personal:
        fail(f"{said}, above the protected tokens' η = {fmt(eta)}: personal data would get "
             "less noise than the other protected tokens; give "
             + ("a larger --personal-p" if p is not None else "a smaller --personal-eta"))
    fail(f"{said}, below the protected tokens' η = {fmt(eta)}: the unprotected tokens "
         "would get more noise than the protected ones; give "
         + ("a smaller --other-p" if p is not None else "a larger --other-eta"))


def policy_text(policy: Any, eta: float) -> str:
    """One line: which tokens get η, and what the others get."""
    from rapt.numfmt import eta as fmt

    what = {"all": "all tokens", "rare": f"personal data and words outside the "
            f"{policy.frequent_rank} most frequent of rapt's public word list",
            "personal": "personal data (Presidio)"}
    rest = ("pass in clear" if policy.eta_other is None
            else f"get η = {fmt(policy.eta_other)}")
    others = "frequent words" if policy.protect == "rare" else "other tokens"
    line = (f"noise by kind of token (--protect {policy.protect}): {what[policy.protect]} get "
            f"η = {fmt(eta)}" + ("" if policy.protect == "all" else f"; {others} {rest}"))
    if policy.eta_personal == 0:
        line += ("; personal data (Presidio) η = 0: each token swapped for a random one before "
                 "the noise, its release does not depend on it")
    elif policy.eta_personal is not None:
        line += f"; personal data (Presidio) η = {fmt(policy.eta_personal)}"
    if policy.personal_rank is not None:
        line += (f"; words outside the {policy.personal_rank} most frequent public words get "
                 "personal data's noise")
    return line


def echo_policy(policy: Any, eta: float, *, prefix: str = "") -> None:
    typer.echo(prefix + policy_text(policy, eta), err=True)
