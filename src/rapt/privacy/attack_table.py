"""The shipped attack table: how much of a release the best of the attackers we ran recovers,
per backbone and η, measured on public text (1 − it: an upper bound on privacy).

``rapt/resources/attack_table.json`` is written by ``benchmarks/bench_attack_table.py``: for each
backbone a grid of η, and at each η the measured replacement probability P and every attacker's
token recovery (over all non-special tokens, and over the replaced ones only) on public text
disjoint from SST-2, with its provenance.  This module only reads it; no number of it is
written here.

* :func:`strongest_at` -- the strongest attacker's recovery at (backbone, η), interpolated
  linearly in log η between grid points (P moves with log η).  Outside the grid, or for a
  backbone the table does not hold, it answers ``recovery=None`` with the reason: it never
  extrapolates.
* :func:`eta_for_target_ep` -- the largest η up to which the strongest attacker recovers at
  most 1 − target of the tokens (empirical privacy = 1 − recovery); an error when no η of the
  table's range gives it.
* :func:`table_line` -- the one line every command prints beside P.

Per kind of token: a table may also hold, per attacker and point, its recovery over the tokens
of rare words and of personal data (``by_kind``: ``all``, ``rare``, ``personal``, and
``frequent``; the kinds of :mod:`rapt.privacy.by_kind`, found in the public text with
Presidio), with the token counts per kind at the point (``n_tokens_by_kind``).
:func:`strongest_at` then answers per kind too (the strongest attacker of each kind); a table
without them answers ``by_kind=None`` with the reason.

Table lookups are by the backbone's name as the commands take it (``minilm``,
``smollm2-135m``): a path or hub id is not in the table, even for the same weights.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["EP_MEANING", "FORMAT", "TABLE_KINDS", "AttackTableError", "KindAnswer", "TableAnswer",
           "ep_phrase", "eta_for_target_ep", "load_table", "strongest_at", "table_line"]

FORMAT = "rapt-attack-table"
VERSION = 1
RESOURCE = "resources/attack_table.json"
SOURCE_NOTE = "shipped table, public text"
_REL = 1e-9  # a grid endpoint given back through float formatting still counts as inside
# What every printed empirical privacy means: no attacker we ran does better, a stronger one may.
EP_MEANING = "1 − the best recovery of the attackers we ran (an upper bound on privacy)"
TABLE_KINDS = ("all", "rare", "personal", "frequent")  # a point's per-kind recoveries
NO_KINDS = ("the table holds no figures per kind of token (written before they were measured; "
            "benchmarks/bench_attack_table.py measures them)")


def ep_phrase(ep: float, attacker: str | None) -> str:
    """The words every privacy line uses for an empirical privacy ``ep`` and the attacker (the
    best of those run) that set it."""
    return f"empirical privacy {ep:.3f} = {EP_MEANING}, set by {attacker or 'no attacker'}"


class AttackTableError(ValueError):
    """The table cannot answer (unreadable file, no such backbone, target out of its range)."""


@dataclass(frozen=True)
class TableAnswer:
    """The strongest attacker at (``backbone``, ``eta``) by the table, or why there is none.

    ``recovery``: share of non-special tokens it recovers (None: not in the table, see
    ``reason``); ``recovery_replaced``: of the replaced tokens only; ``p``: the table's P at η
    (interpolated); ``attacker`` / ``attacker_name``: registry key and readable name;
    ``grid_point``: η is one of the table's points (no interpolation)."""

    backbone: str
    eta: float
    recovery: float | None = None
    recovery_replaced: float | None = None
    p: float | None = None
    attacker: str | None = None
    attacker_name: str | None = None
    grid_point: bool = False
    reason: str | None = None

    # per kind of :data:`TABLE_KINDS`: its strongest attacker (None: not in the table, see
    # ``by_kind_reason``)
    by_kind: dict[str, KindAnswer] | None = None
    by_kind_reason: str | None = None

    @property
    def empirical_privacy(self) -> float | None:
        return None if self.recovery is None else 1.0 - self.recovery


@dataclass(frozen=True)
class KindAnswer:
    """The strongest attacker on one kind of token at (backbone, η) by the table:
    ``recovery`` of that kind's tokens (None: the public text held none at a neighbouring point),
    the ``attacker`` / ``attacker_name`` that reaches it and the kind's ``n_tokens`` there (the
    smaller of the two neighbouring points')."""

    recovery: float | None
    attacker: str | None
    attacker_name: str | None
    n_tokens: int

    @property
    def empirical_privacy(self) -> float | None:
        return None if self.recovery is None else 1.0 - self.recovery


def _err(where: str, msg: str) -> AttackTableError:
    return AttackTableError(f"{where}: {msg}")


def _number(value: Any, where: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            lo <= float(value) <= hi) or not math.isfinite(float(value)):
        raise _err(where, f"must be a finite number in [{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def _check_backbone(name: str, entry: Any, where: str) -> None:
    """Points sorted by η (strictly), each with P and recoveries in [0, 1] of known attackers."""
    if not isinstance(entry, dict) or not isinstance(entry.get("points"), list):
        raise _err(f"{where}.backbones.{name}", "needs a 'points' list")
    attackers = entry.get("attackers")
    if not isinstance(attackers, dict) or not attackers:
        raise _err(f"{where}.backbones.{name}.attackers", "must name the attackers")
    if len(entry["points"]) < 2:
        raise _err(f"{where}.backbones.{name}.points", "needs at least 2 points")
    last = 0.0
    for i, pt in enumerate(entry["points"]):
        at = f"{where}.backbones.{name}.points[{i}]"
        if not isinstance(pt, dict) or not isinstance(pt.get("recovery"), dict) or not pt[
                "recovery"]:
            raise _err(at, "needs 'eta', 'p' and a non-empty 'recovery' object")
        eta = _number(pt.get("eta"), f"{at}.eta", 0.0)
        if eta <= last:
            raise _err(f"{at}.eta", f"η must increase strictly along the grid ({eta:g} after "
                       f"{last:g})")
        last = eta
        _number(pt.get("p"), f"{at}.p", 0.0, 1.0)
        for key, rec in pt["recovery"].items():
            if key not in attackers:
                raise _err(f"{at}.recovery.{key}", "attacker not listed under 'attackers'")
            if not isinstance(rec, dict):
                raise _err(f"{at}.recovery.{key}", "must hold 'all' and 'replaced'")
            _number(rec.get("all"), f"{at}.recovery.{key}.all", 0.0, 1.0)
            _number(rec.get("replaced"), f"{at}.recovery.{key}.replaced", 0.0, 1.0)
            if "by_kind" in rec:
                _check_kinds(rec["by_kind"], pt.get("n_tokens_by_kind"),
                             f"{at}.recovery.{key}.by_kind")


def _check_kinds(by_kind: Any, counts: Any, where: str) -> None:
    """Every kind's recovery in [0, 1], or None exactly where the point counts no token."""
    if not isinstance(by_kind, dict) or not isinstance(counts, dict):
        raise _err(where, "needs a recovery per kind and the point's 'n_tokens_by_kind'")
    for kind in TABLE_KINDS:
        n = counts.get(kind)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise _err(f"{where} (n_tokens_by_kind.{kind})", f"must be a count, got {n!r}")
        if kind not in by_kind:
            raise _err(f"{where}.{kind}", "missing")
        if n == 0 and by_kind[kind] is not None:
            raise _err(f"{where}.{kind}", "must be null: the point has no token of this kind")
        if n > 0:
            _number(by_kind[kind], f"{where}.{kind}", 0.0, 1.0)


def parse_table(doc: Any, where: str = "attack table") -> dict:
    """``doc`` checked (format, version, every point): the table; AttackTableError naming the
    field otherwise."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _err(f"{where}: field 'format'", f"must be {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise _err(f"{where}: field 'version'", f"must be {VERSION}, got {doc.get('version')!r}")
    if not isinstance(doc.get("backbones"), dict) or not doc["backbones"]:
        raise _err(f"{where}: field 'backbones'", "must hold at least one backbone")
    for name, entry in doc["backbones"].items():
        _check_backbone(name, entry, where)
    return doc


@lru_cache(maxsize=4)
def _load_path(path: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise AttackTableError(f"{path}: cannot read the attack table ({e})") from e
    return parse_table(doc, path)


def load_table(path: str | Path | None = None) -> dict:
    """The attack table in ``path`` (default: the one shipped in the package), checked and
    cached; AttackTableError naming the file and field when it is not one."""
    if path is None:
        from importlib.resources import files

        path = str(files("rapt").joinpath(RESOURCE))
    return _load_path(str(path))


def _grid(table: dict, backbone: str) -> tuple[dict | None, str | None]:
    entry = table["backbones"].get(backbone)
    if entry is None:
        return None, (f"backbone {backbone!r} is not in it (it holds "
                      f"{', '.join(sorted(table['backbones']))})")
    return entry, None


def _bracket(points: list[dict], eta: float) -> tuple[int, int, float] | None:
    """(i, j, w): η lies between points i and j at weight w on j (log η); None outside."""
    lo, hi = points[0]["eta"], points[-1]["eta"]
    if not lo * (1 - _REL) <= eta <= hi * (1 + _REL):
        return None
    for j, pt in enumerate(points):
        if abs(pt["eta"] - eta) <= _REL * pt["eta"]:
            return j, j, 0.0
        if pt["eta"] > eta:
            a, b = points[j - 1]["eta"], pt["eta"]
            return j - 1, j, (math.log(eta) - math.log(a)) / (math.log(b) - math.log(a))
    return len(points) - 1, len(points) - 1, 0.0


def _lerp(a: float, b: float, w: float) -> float:
    return a + w * (b - a)


def strongest_at(backbone: str, eta: float, table: dict | None = None) -> TableAnswer:
    """The strongest attacker's token recovery at (``backbone``, ``eta``) by the table: every
    attacker measured at both neighbouring grid points is interpolated linearly in log η, and
    the one recovering most (over all tokens) is named.  Outside the grid or for an unknown
    backbone: ``recovery=None`` and the reason."""
    eta = float(eta)
    if table is None:
        try:
            table = load_table()
        except AttackTableError as e:  # a broken install: say so where the number would be
            return TableAnswer(backbone, eta, reason=str(e))
    entry, why = _grid(table, backbone)
    if entry is None:
        return TableAnswer(backbone, eta, reason=why)
    pts = entry["points"]
    where = _bracket(pts, eta) if math.isfinite(eta) and eta > 0 else None
    if where is None:
        return TableAnswer(backbone, eta, reason=(
            f"η = {eta:.6g} is outside the table's range for {backbone}: η {pts[0]['eta']:.6g} "
            f"(P {pts[0]['p']:.2f}) to {pts[-1]['eta']:.6g} (P {pts[-1]['p']:.2f})"))
    i, j, w = where
    a, b = pts[i]["recovery"], pts[j]["recovery"]
    both = [k for k in a if k in b]
    if not both:  # no attacker measured at both ends (a banded one on each side)
        return TableAnswer(backbone, eta, reason=f"no attacker of the table is measured on both "
                           f"sides of η = {eta:.4g} for {backbone}")
    rec = {k: (_lerp(a[k]["all"], b[k]["all"], w), _lerp(a[k]["replaced"], b[k]["replaced"], w))
           for k in both}
    best = max(both, key=lambda k: (rec[k][0], k == "nn"))
    kinds, why_not = _kinds_at(entry, pts[i], pts[j], w, both)
    return TableAnswer(backbone, eta, rec[best][0], rec[best][1],
                       _lerp(pts[i]["p"], pts[j]["p"], w), best,
                       str(entry["attackers"][best].get("name", best)), i == j, None, kinds,
                       why_not)


def _kinds_at(entry: dict, a: dict, b: dict, w: float, attackers: list[str]
              ) -> tuple[dict[str, KindAnswer] | None, str | None]:
    """Per kind, the strongest of ``attackers`` between points ``a`` and ``b`` (weight ``w`` on
    b); (None, why) when the table holds no per-kind figures there."""
    have = [k for k in attackers if "by_kind" in a["recovery"][k] and "by_kind" in b[
        "recovery"][k]]
    if not have:
        return None, NO_KINDS
    out = {}
    for kind in TABLE_KINDS:
        n = min(a["n_tokens_by_kind"][kind], b["n_tokens_by_kind"][kind])
        rec = {k: _lerp(a["recovery"][k]["by_kind"][kind], b["recovery"][k]["by_kind"][kind], w)
               for k in have if n > 0}
        best = max(rec, key=lambda k: (rec[k], k == "nn")) if rec else None
        out[kind] = KindAnswer(None if best is None else rec[best], best,
                               None if best is None else str(
                                   entry["attackers"][best].get("name", best)), n)
    return out, None


def _first_crossing(points: list[dict], bound: float) -> float | None:
    """The smallest η at which :func:`strongest_at` reports a recovery above ``bound`` (None:
    nowhere on the grid).  Between two points only attackers measured at both count, each
    linear in log η, so a crossing lies in the segment ending at the first point above the
    bound; a later dip (sampling noise) is never used."""
    for j, pt in enumerate(points):
        if max(v["all"] for v in pt["recovery"].values()) <= bound:
            continue
        if j == 0:
            return points[0]["eta"]
        a, b = points[j - 1]["recovery"], pt["recovery"]
        ts = [(bound - a[k]["all"]) / (b[k]["all"] - a[k]["all"]) for k in a
              if k in b and a[k]["all"] <= bound < b[k]["all"]]
        la, lb = math.log(points[j - 1]["eta"]), math.log(pt["eta"])
        # only an attacker measured at this point alone crosses: just below the point
        return math.exp(la + min(ts) * (lb - la)) if ts else pt["eta"] * (1 - 1e-6)
    return None


def eta_for_target_ep(backbone: str, target_ep: float, table: dict | None = None) -> float:
    """The largest η up to which the table's strongest attacker (as :func:`strongest_at`
    reports it) recovers at most 1 − ``target_ep`` of the tokens, i.e. empirical privacy ≥
    target_ep at this η and at every smaller one on the grid.  AttackTableError when the
    backbone is not in the table or no η of its range gives it."""
    if not 0.0 < float(target_ep) < 1.0:
        raise AttackTableError(f"target empirical privacy must lie strictly between 0 and 1, got "
                               f"{target_ep}")
    table = load_table() if table is None else table
    entry, why = _grid(table, backbone)
    if entry is None:
        raise AttackTableError(f"the attack table cannot calibrate η: {why}")
    pts = entry["points"]
    bound = 1.0 - float(target_ep)
    eta = _first_crossing(pts, bound)
    if eta is None:
        top = strongest_at(backbone, pts[-1]["eta"], table)
        raise AttackTableError(
            f"empirical privacy {target_ep:g} is below the table's range for {backbone}: even "
            f"at its largest η ({pts[-1]['eta']:.4g}, P {pts[-1]['p']:.2f}) the strongest "
            f"attacker recovers only {top.recovery:.1%} (empirical privacy "
            f"{top.empirical_privacy:.3f}); give --eta or --target-p instead")
    if eta <= pts[0]["eta"]:
        low = strongest_at(backbone, pts[0]["eta"], table)
        raise AttackTableError(
            f"empirical privacy {target_ep:g} is out of the table's reach for {backbone}: at its "
            f"smallest η ({pts[0]['eta']:.4g}, P {pts[0]['p']:.2f}) the strongest attacker still "
            f"recovers {low.recovery:.1%} of the tokens (empirical privacy "
            f"{low.empirical_privacy:.3f})")
    return eta


def table_line(backbone: str, eta: float, table: dict | None = None) -> str:
    """One line for the commands that print P: the best recovery of the attackers the shipped
    table ran at this backbone and η (an upper bound on privacy), or why it has no answer."""
    from rapt import numfmt

    ans = strongest_at(backbone, eta, table)
    if ans.recovery is None:
        return f"best attacker we ran: not in the table, {ans.reason} ({SOURCE_NOTE})"
    return (f"best attacker we ran at η = {numfmt.eta(eta)}: {ans.attacker_name} recovers "
            f"{ans.recovery:.1%} of the tokens ({ans.recovery_replaced:.1%} of the replaced "
            f"ones); {ep_phrase(ans.empirical_privacy, ans.attacker_name)}"
            f"{_kinds_phrase(ans.by_kind)} ({SOURCE_NOTE}, P there {numfmt.p(ans.p)})")


KIND_LABELS = {"rare": "rare-word privacy", "personal": "personal-data privacy"}


def _kinds_phrase(by_kind: dict[str, KindAnswer] | None) -> str:
    """"; rare-word privacy 0.412 (mechanism-aware Bayes); personal-data privacy ..." when the
    table holds per-kind figures, else nothing."""
    if by_kind is None:
        return ""
    parts = []
    for kind, label in KIND_LABELS.items():
        k = by_kind[kind]
        parts.append(f"{label}: no such tokens in the public text" if k.recovery is None
                     else f"{label} {k.empirical_privacy:.3f} ({k.attacker_name}, "
                          f"{k.n_tokens:,} tokens)")
    return "; " + "; ".join(parts)
