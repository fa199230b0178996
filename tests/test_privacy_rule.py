"""The one weak-privacy rule (issue 32 item 3, issue 28 item 5): `rapt.privacy.rule.judge`, its
threshold, and the default levels of the commands that privatize without being told."""

from __future__ import annotations

import math

import pytest

from rapt.privacy.attack_table import load_table, strongest_at
from rapt.privacy.rule import (
    DEFAULT_MIN_P,
    DEFAULT_PROTECTED_P,
    DEFAULT_TARGET_P,
    judge,
    weak_privacy_warning,
)


def _eta_at_p(backbone: str, p: float) -> float:
    """The η at which the shipped table's P is ``p`` (linear in log η between grid points)."""
    pts = load_table()["backbones"][backbone]["points"]
    for a, b in zip(pts, pts[1:], strict=False):
        if a["p"] >= p >= b["p"]:
            w = (a["p"] - p) / (a["p"] - b["p"])
            return math.exp(math.log(a["eta"]) + w * (math.log(b["eta"]) - math.log(a["eta"])))
    raise AssertionError(f"P {p} outside the table for {backbone}")


@pytest.mark.parametrize("backbone", ["minilm", "smollm2-135m"])
def test_table_level_decides_for_the_packaged_backbones(backbone):
    """P 0.4 (the README's old level) is weak by the table's strongest attacker; the default
    level is not. The table's number is fixed, so it needs no sampling margin; since the
    contextual denoiser joined MiniLM's table its margin at the default is small (0.535 against
    the rule's 0.5), and a release measured at the default P is judged on its own recovery too."""
    weak = judge(None, backbone=backbone, eta=_eta_at_p(backbone, 0.4))
    assert weak.weak and weak.empirical_privacy < 0.45, weak
    assert "attack table" in weak.attacker
    ok = judge(None, backbone=backbone, eta=_eta_at_p(backbone, DEFAULT_TARGET_P))
    assert not ok.weak and ok.empirical_privacy > DEFAULT_MIN_P, ok
    measured = {"eta": ok.eta, "replacement_probability": DEFAULT_TARGET_P - 0.03,
                "inversion_success": 1 - DEFAULT_TARGET_P + 0.03, "n_tokens": 2000}
    assert not judge(measured, backbone=backbone).weak  # a release a few points off the level


def test_measured_recovery_on_the_release_counts():
    """The table says fine, but nearest neighbour recovered 70 % of this release: weak, and the
    message names that attacker and the recovery."""
    eta = _eta_at_p("minilm", 0.7)
    report = {"eta": eta, "replacement_probability": 0.31, "inversion_success": 0.70}
    v = judge(report, backbone="minilm")
    assert v.weak and v.attacker == "nearest neighbour on this release"
    assert v.empirical_privacy == pytest.approx(0.30)
    msg = weak_privacy_warning(report, backbone="minilm", what="upload")
    assert msg.startswith("weak privacy on this upload") and "70.0%" in msg and "0.300" in msg
    assert "(an upper bound on privacy), set by nearest neighbour on this release" in msg
    # the same release with the inversion the table predicts: not weak
    ok = {**report, "replacement_probability": 0.7, "inversion_success": 0.3}
    assert weak_privacy_warning(ok, backbone="minilm") is None


def test_channel_model_recovery_counts():
    eta = _eta_at_p("minilm", 0.7)
    report = {"eta": eta, "replacement_probability": 0.7, "inversion_success": 0.3,
              "channel": {"recovery": 0.55}}
    v = judge(report, backbone="minilm")
    assert v.weak and v.attacker == "the channel model on this release"


def test_backbone_outside_the_table_falls_back_to_what_was_measured():
    v = judge({"eta": 5.0, "replacement_probability": 0.45, "inversion_success": 0.52},
              backbone="/models/tiny")
    assert v.weak and v.empirical_privacy == pytest.approx(0.48)
    # nothing but P: P stands in for empirical privacy
    assert judge({"eta": 5.0, "replacement_probability": 0.45}, backbone="/models/tiny").weak
    assert not judge({"eta": 5.0, "replacement_probability": 0.55},
                     backbone="/models/tiny").weak
    # nothing at all: no verdict, no warning
    v = judge(None, backbone="/models/tiny", eta=5.0)
    assert v.empirical_privacy is None and not v.weak


def test_threshold_is_the_one_given():
    report = {"eta": 5.0, "replacement_probability": 0.45, "inversion_success": 0.55}
    assert judge(report, backbone="x", min_p=0.4).weak is False
    assert judge(report, backbone="x", min_p=0.5).weak is True
    with pytest.raises(ValueError, match="min_p"):
        judge(report, backbone="x", min_p=1.5)


def test_defaults_are_not_flagged():
    """`rapt demo --paper` and `rapt privatize --protect all` privatize by default at
    DEFAULT_TARGET_P, the protected tokens of rapt's default policy at DEFAULT_PROTECTED_P,
    neither flagged; the demo's benchmark profile keeps its explicit P 0.4 (flagged, with a
    warning, as any explicit weak level)."""
    import typer.main

    from rapt.cli import app
    from rapt.demo import DemoConfig

    assert DemoConfig().target_p == DEFAULT_TARGET_P
    assert DemoConfig.benchmark().target_p == 0.4
    assert not judge(None, backbone="minilm", eta=_eta_at_p("minilm", DemoConfig().target_p)).weak
    cmd = typer.main.get_command(app).commands["privatize"]
    params = {p.name: p for p in cmd.params}
    assert params["eta"].default is None and params["target_p"].default is None
    assert f"default {DEFAULT_PROTECTED_P:g} for the protected tokens, {DEFAULT_TARGET_P:g} " \
        "under --protect all" in params["target_p"].help
    assert not judge(None, backbone="minilm", eta=_eta_at_p("minilm", DEFAULT_PROTECTED_P)).weak
    # the table's P at the default level is the level asked for (calibration and table agree)
    ans = strongest_at("minilm", _eta_at_p("minilm", DEFAULT_TARGET_P))
    assert ans.p == pytest.approx(DEFAULT_TARGET_P, abs=1e-6)


def test_a_few_tokens_are_not_enough_to_call_a_release_weak():
    """A measured recovery counts only when significantly above 1 − min_p: 55 % of 20 tokens
    is chance at the default level, 55 % of 2,000 is not."""
    eta = _eta_at_p("minilm", 0.6)
    few = {"eta": eta, "replacement_probability": 0.45, "inversion_success": 0.55,
           "n_tokens": 20}
    assert judge(few, backbone="minilm").weak is False
    assert judge({**few, "n_tokens": 2000}, backbone="minilm").weak is True
    # far below: even 20 tokens say so
    assert judge({**few, "inversion_success": 0.95, "n_tokens": 20}, backbone="minilm").weak
