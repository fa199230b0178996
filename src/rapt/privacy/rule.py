"""The one weak-privacy rule of every command that privatizes.

A release is *weak* when its empirical privacy, 1 − the best token recovery of the attackers
rapt ran at its η (an upper bound on privacy), is below ``min_p`` (default
:data:`DEFAULT_MIN_P` = 0.5: that attacker recovers more than half of the text tokens). The
recoveries that count:

* the shipped attack table's best attacker at (backbone, η), measured on public text
  (:func:`rapt.privacy.attack_table.strongest_at`): fixed for a configured level, so a level is
  judged the same way by every command;
* the nearest-neighbour inversion measured on this release (``inversion_success`` of
  :func:`rapt.privacy.mechanism.privacy_report`), which catches data that privatize worse than the
  public text;
* the channel model's recovery when the rows were read back by one (denoise-then-tune).

A measured recovery counts against the threshold only when it is significantly above
1 − ``min_p`` (one-sided 95 %, binomial over its ``n_tokens``): a 20-token query is not weak
because a few more of its tokens happened to go out unchanged. The table's number is used as
it is.

Without any recovery (a backbone outside the table and nothing measured) the measured
replacement probability P stands in: for dχ text-to-text, nearest neighbour recovers about the
1 − P of the tokens that go out unchanged. P and empirical privacy are therefore on one scale:
P 0.4 means that 60 % of the words go out as they are.

No command privatizes by default at a level this rule flags: the default policy
(:func:`rapt.privacy.by_kind.default_policy`) noises its protected tokens at
:data:`DEFAULT_PROTECTED_P`, uniform noise (``--protect all``) is at :data:`DEFAULT_TARGET_P`,
both clear of the threshold.

The verdict also carries the rare-word privacy and the personal-data privacy (empirical privacy
over the tokens of rare words and of personal data: the lowest the table's per-kind figures and
the release's measured ones give, with the attacker that sets it) and the warning prints them
beside the all-token figure; whether a release is weak is still decided on all tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["DEFAULT_MIN_P", "DEFAULT_PROTECTED_P", "DEFAULT_TARGET_P", "KIND_LABELS", "MIN_P_HELP",
           "KindFigure",
           "PrivacyVerdict", "judge", "weak_privacy_warning"]

DEFAULT_MIN_P = 0.5  # below it the best attacker we ran reads most of the tokens
DEFAULT_TARGET_P = 0.6  # the uniform level (--protect all) where a command is not told one
# The default level of the protected classes under --protect rare|personal: the lowest level
# of the grid whose per-kind privacy against the domain denoiser (which reads the clear
# context) is at least uniform P 0.6's on SST-2 and FP dev (privacy_by_mechanism.md: at P 0.6's
# η, rare words and personal data lose 1-4 points to the clear context).
DEFAULT_PROTECTED_P = 0.7
MIN_P_HELP = ("warn when the release's empirical privacy (1 − the best token recovery of the "
              "attackers rapt ran: its attack table at this η, and nearest neighbour on this "
              "release; an upper bound on privacy, at or below P) is below this")


KIND_LABELS = {"rare": "rare-word privacy", "personal": "personal-data privacy"}


@dataclass(frozen=True)
class KindFigure:
    """One kind of token's empirical privacy (None: no token of it was measured) and the
    attacker that sets it."""

    empirical_privacy: float | None
    attacker: str | None


@dataclass(frozen=True)
class PrivacyVerdict:
    """What the rule says of one release: ``empirical_privacy`` (None: nothing to judge by),
    the ``attacker`` that sets it, the measured ``p``, the threshold and ``weak``; ``by_kind``:
    the rare-word and personal-data privacy (keys of :data:`KIND_LABELS`) where measured."""

    empirical_privacy: float | None
    attacker: str | None
    p: float | None
    eta: float | None
    min_p: float
    weak: bool
    by_kind: dict[str, KindFigure] = field(default_factory=dict)
    # the kinds ``weak`` was judged on (noise by kind: the protected ones); empty: all tokens
    judged_on: tuple[str, ...] = ()

    def kinds_phrase(self) -> str:
        """"rare-word privacy 0.412 (nearest neighbour on this release); personal-data ..." or
        "" when no kind was measured."""
        parts = []
        for kind, label in KIND_LABELS.items():
            f = self.by_kind.get(kind)
            if f is not None:
                parts.append(f"{label}: no such tokens" if f.empirical_privacy is None else
                             f"{label} {f.empirical_privacy:.3f} ({f.attacker})")
        return "; ".join(parts)

    def message(self, what: str = "release") -> str:
        """One warning line for a weak release (the command adds its own prefix)."""
        ep = self.empirical_privacy
        from rapt import numfmt
        from rapt.privacy.attack_table import ep_phrase

        level = f"η = {numfmt.eta(self.eta)}" if self.eta is not None else "this level"
        p = f"measured P = {numfmt.p(self.p)}, " if self.p is not None else ""

        if self.judged_on:
            weakest = min((f for k, f in self.by_kind.items() if k in self.judged_on
                           and f.empirical_privacy is not None),
                          key=lambda f: f.empirical_privacy)
            return (f"weak privacy on this {what}'s protected tokens: "
                    f"{self.kinds_phrase()}; the weakest, "
                    f"{ep_phrase(weakest.empirical_privacy, weakest.attacker)}, < --min-p "
                    f"{self.min_p:g} at {level} (all tokens: {ep:.3f}, {p}the frequent words "
                    "pass with less noise or none); for more privacy use a higher --target-p "
                    f"(the default for the protected tokens is {DEFAULT_PROTECTED_P:g})")
        return (f"weak privacy on this {what}: {p}the best attacker we ran ({self.attacker}) "
                f"recovers {1 - ep:.1%} of the tokens, {ep_phrase(ep, self.attacker)}, < "
                f"--min-p {self.min_p:g} at {level}"
                f"{'; ' + self.kinds_phrase() if self.by_kind else ''}; for more privacy use a "
                f"higher --target-p (the default level is {DEFAULT_TARGET_P:g}) or a smaller "
                "--eta")


def judge(report: dict | None, *, backbone: str, eta: float | None = None,
          min_p: float = DEFAULT_MIN_P) -> PrivacyVerdict:
    """The rule on a release: ``report`` is a privacy report (``eta``,
    ``replacement_probability``, ``inversion_success``, optionally ``channel``) or None (judge
    η alone, through the table); ``backbone`` the name the attack table is keyed by. Nothing
    to judge by (no η in the table, nothing measured): not weak, ``empirical_privacy`` None."""
    if not 0.0 <= float(min_p) <= 1.0:
        raise ValueError(f"min_p must lie in [0, 1], got {min_p}")
    report = report or {}
    eta = report.get("eta", eta) if eta is None else eta
    p = report.get("replacement_probability")
    # who -> (recovery, tokens it was measured on; None: the table's, taken as it is)
    recoveries: dict[str, tuple[float, int | None]] = {}
    ans = None
    if eta is not None:
        from rapt.privacy.attack_table import strongest_at

        ans = strongest_at(backbone, float(eta))
        if ans.recovery is not None:
            recoveries[f"{ans.attacker_name}, rapt's attack table"] = (ans.recovery, None)
    kinds = _kind_figures(report.get("by_kind"), None if ans is None else ans.by_kind)
    if report.get("inversion_success") is not None:
        recoveries["nearest neighbour on this release"] = (float(report["inversion_success"]),
                                                           report.get("n_tokens"))
    channel = report.get("channel") or {}
    if channel.get("recovery") is not None:
        recoveries["the channel model on this release"] = (float(channel["recovery"]),
                                                           channel.get("n_tokens"))
    protected = tuple(report.get("protected_kinds") or ())
    if protected and recoveries:
        # Noise by kind: the frequent words pass with less noise or none by design, so the rule
        # reads the protected kinds (the lowest of the table's and the measured figures); the
        # all-token figure is kept for printing beside them.
        who = max(recoveries, key=lambda k: recoveries[k][0])
        ep = 1.0 - recoveries[who][0]
        measured = report.get("by_kind") or {}
        weak = any(f.empirical_privacy is not None and _significantly_below(
            f.empirical_privacy, (measured.get(k) or {}).get("n_tokens"), min_p)
            for k, f in kinds.items() if k in protected)
        return PrivacyVerdict(ep, who, None if p is None else float(p), eta, min_p, weak,
                              kinds, protected)
    if recoveries:
        who = max(recoveries, key=lambda k: recoveries[k][0])
        ep = 1.0 - recoveries[who][0]
        weak = any(_significantly_below(1.0 - r, n, min_p) for r, n in recoveries.values())
    elif p is not None:
        who, ep = "nearest neighbour, about 1 − P", float(p)
        weak = _significantly_below(ep, report.get("n_tokens"), min_p)
    else:
        return PrivacyVerdict(None, None, None, eta, min_p, False, kinds)
    return PrivacyVerdict(ep, who, None if p is None else float(p), eta, min_p, weak, kinds)


def _kind_figures(measured: dict | None, table: dict | None) -> dict[str, KindFigure]:
    """Per kind of :data:`KIND_LABELS`: the lowest empirical privacy of the release's measured
    figures (``by_kind`` of a privacy report) and the table's (``TableAnswer.by_kind``), with
    the attacker that sets it; a kind with figures from neither is left out, one whose sources
    counted no token of it is None."""
    out = {}
    for kind in KIND_LABELS:
        found: list[tuple[float, str]] = []
        seen = False
        if measured and kind in measured:
            seen = True
            m = measured[kind]
            if m.get("empirical_privacy") is not None:
                found.append((float(m["empirical_privacy"]), f"{m['attacker']} on this release"))
        if table and kind in table:
            seen = True
            t = table[kind]
            if t.recovery is not None:
                found.append((1.0 - t.recovery, f"{t.attacker_name}, rapt's attack table"))
        if found:
            out[kind] = KindFigure(*min(found))
        elif seen:
            out[kind] = KindFigure(None, None)
    return out


def _significantly_below(ep: float, n: int | None, min_p: float, z: float = 1.645) -> bool:
    """``ep`` < ``min_p``, and for a share measured on ``n`` tokens also its one-sided 95 %
    upper bound (normal approximation, at least half a token of slack)."""
    if not n:
        return ep < min_p
    half = z * math.sqrt(max(ep * (1.0 - ep), 0.25 / n) / n)
    return ep + half < min_p


def weak_privacy_warning(report: dict | None, *, backbone: str, eta: float | None = None,
                         min_p: float = DEFAULT_MIN_P, what: str = "release") -> str | None:
    """The warning line of :func:`judge` when the release is weak, else None."""
    v = judge(report, backbone=backbone, eta=eta, min_p=min_p)
    return v.message(what) if v.weak and v.empirical_privacy is not None else None
