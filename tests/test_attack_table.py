"""The shipped attack table (rapt.privacy.attack_table): interpolation, refusal outside the grid,
--target-ep's η, the shipped resource itself, and the line the commands print beside P."""

from __future__ import annotations

import json
import math
from importlib.resources import files
from pathlib import Path

import pytest
from _tiny import make_bert, save_backbone
from typer.testing import CliRunner

from rapt.cli import app
from rapt.privacy import attack_table
from rapt.privacy.attack_table import (
    AttackTableError,
    eta_for_target_ep,
    load_table,
    parse_table,
    strongest_at,
    table_line,
)

ETAS = [40.0, 50.0, 62.5, 78.125, 97.65625]


def _table(name: str = "bb", nn=(0.2, 0.35, 0.55, 0.75, 0.9), bayes=(0.25, 0.33, 0.5, 0.7, 0.92),
           extra: dict | None = None) -> dict:
    points = []
    for i, eta in enumerate(ETAS):
        rec = {"nn": {"all": nn[i], "replaced": 0.0},
               "bayes": {"all": bayes[i], "replaced": 0.1 * (i + 1)}}
        rec.update((extra or {}).get(i, {}))
        points.append({"eta": eta, "p": 1 - nn[i], "recovery": rec})
    attackers = {"nn": {"name": "nearest neighbour"}, "bayes": {"name": "mechanism-aware Bayes"},
                 "denoiser": {"name": "contextual denoiser"}}
    return parse_table({"format": "rapt-attack-table", "version": 1,
                        "backbones": {name: {"attackers": attackers, "points": points}}})


def test_grid_points_are_read_as_they_are():
    t = _table()
    a = strongest_at("bb", 40.0, t)
    assert (a.attacker, a.recovery, a.recovery_replaced, a.grid_point) == ("bayes", 0.25, 0.1,
                                                                         True)
    a = strongest_at("bb", 50.0, t)
    assert (a.attacker_name, a.recovery, a.p) == ("nearest neighbour", 0.35, pytest.approx(0.65))
    assert a.empirical_privacy == pytest.approx(0.65)


def test_interpolation_is_linear_in_log_eta_and_names_the_stronger():
    t = _table()
    mid = math.sqrt(50.0 * 62.5)  # halfway in log η
    a = strongest_at("bb", mid, t)
    assert not a.grid_point and a.attacker == "nn"
    assert a.recovery == pytest.approx((0.35 + 0.55) / 2)
    assert a.p == pytest.approx(1 - (0.35 + 0.55) / 2)
    # between 78.125 and 97.65625 the two cross: Bayes wins near the top end
    top = strongest_at("bb", 97.0, t)
    assert top.attacker == "bayes"
    w = (math.log(97.0) - math.log(78.125)) / (math.log(97.65625) - math.log(78.125))
    assert top.recovery == pytest.approx(0.7 + w * (0.92 - 0.7))


def test_an_attacker_measured_on_one_side_only_is_not_interpolated():
    """A denoiser is only valid near its η band: where the table has it at one neighbouring
    point only, it does not count between them (it does at its own points)."""
    t = _table(extra={2: {"denoiser": {"all": 0.99, "replaced": 0.9}}})
    assert strongest_at("bb", 62.5, t).attacker == "denoiser"
    assert strongest_at("bb", 70.0, t).attacker != "denoiser"
    assert strongest_at("bb", 55.0, t).recovery < 0.99


@pytest.mark.parametrize("eta", [39.0, 98.0, 1e9, 0.0, -5.0, float("nan"), float("inf")])
def test_outside_the_grid_is_not_in_the_table(eta):
    a = strongest_at("bb", eta, _table())
    assert a.recovery is None and a.empirical_privacy is None and a.attacker is None
    assert "outside the table's range" in a.reason
    line = table_line("bb", eta, _table())
    assert "not in the table" in line and "(shipped table, public text)" in line


def test_unknown_backbone_is_not_in_the_table():
    a = strongest_at("other", 60.0, _table())
    assert a.recovery is None and "'other' is not in it" in a.reason and "bb" in a.reason
    with pytest.raises(AttackTableError, match="'other' is not in it"):
        eta_for_target_ep("other", 0.5, _table())


def test_eta_for_target_ep_is_monotone_and_meets_its_bound():
    t = _table()
    targets = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    etas = [eta_for_target_ep("bb", x, t) for x in targets]
    assert all(a > b for a, b in zip(etas, etas[1:], strict=False))  # more privacy, more noise
    for x, eta in zip(targets, etas, strict=True):
        assert ETAS[0] <= eta <= ETAS[-1]
        assert strongest_at("bb", eta, t).recovery <= 1 - x + 1e-9
        above = eta * 1.02
        if above <= ETAS[-1]:  # the largest such η: a little less noise breaks the bound
            assert strongest_at("bb", above, t).recovery > 1 - x
    # a grid point's own strongest recovery gives back that point
    assert eta_for_target_ep("bb", 1 - 0.55, t) == pytest.approx(62.5)


def test_eta_for_target_ep_is_conservative_where_the_curve_dips():
    """Sampling noise can make recovery dip as η grows; the η returned must not sit in a dip
    past a point that already recovers too much."""
    t = _table(nn=(0.2, 0.5, 0.4, 0.75, 0.9), bayes=(0.1, 0.1, 0.1, 0.1, 0.1))
    eta = eta_for_target_ep("bb", 0.55, t)  # bound 0.45: first crossed between 40 and 50
    assert 40.0 < eta < 50.0
    assert strongest_at("bb", eta, t).recovery <= 0.45 + 1e-9


def test_eta_for_target_ep_refuses_what_the_table_cannot_give():
    t = _table()
    with pytest.raises(AttackTableError, match="out of the table's reach"):
        eta_for_target_ep("bb", 0.9, t)  # even the noisiest point recovers 25 %
    with pytest.raises(AttackTableError, match="below the table's range"):
        eta_for_target_ep("bb", 0.05, t)  # every point already gives EP ≥ 0.08
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(AttackTableError, match="strictly between 0 and 1"):
            eta_for_target_ep("bb", bad, t)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(format="x"), "format"),
    (lambda d: d.update(version=9), "version"),
    (lambda d: d["backbones"]["bb"]["points"][1].update(eta=30.0), "points[1].eta"),
    (lambda d: d["backbones"]["bb"]["points"][0]["recovery"]["nn"].update(all=1.5),
     "points[0].recovery.nn.all"),
    (lambda d: d["backbones"]["bb"]["points"][0]["recovery"].update(llm={"all": 0.1,
                                                                         "replaced": 0}),
     "points[0].recovery.llm"),
])
def test_a_bad_table_names_its_field(tmp_path, mutate, field):
    doc = json.loads(json.dumps(_table()))
    mutate(doc)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(AttackTableError, match=r"t\.json") as e:
        load_table(path)
    assert field in str(e.value)


# --------------------------------------------------------------------------- the shipped file

SHIPPED = Path(str(files("rapt").joinpath("resources/attack_table.json")))


def test_the_shipped_table_parses_and_covers_both_backbones():
    doc = json.loads(SHIPPED.read_text())
    table = load_table()
    assert table == doc
    prov = doc["provenance"]
    for key in ("command", "rapt_version", "commit", "date", "public_text", "machine"):
        assert prov.get(key), key
    for name in ("minilm", "smollm2-135m"):
        e = doc["backbones"][name]
        ps = [pt["p"] for pt in e["points"]]
        assert len(ps) >= 10 and min(ps) <= 0.1 and max(ps) >= 0.8, ps
        assert all(a > b for a, b in zip(ps, ps[1:], strict=False))  # P falls as η grows
        assert e["tokenizer"] and e["corpus"]["disjoint_from"] == "sst2"
        assert e["corpus"]["attacked_tokens"] > 1000 and e["corpus"]["prior_tokens"] > 10000
        assert all({"nn", "bayes"} <= set(pt["recovery"]) for pt in e["points"])
        for pt in e["points"]:  # nearest neighbour recovers exactly the kept tokens
            assert pt["recovery"]["nn"]["all"] == pytest.approx(1 - pt["p"], abs=1e-9)
            assert pt["strongest"] == max(pt["recovery"], key=lambda k: pt["recovery"][k]["all"])
            # the Bayes attacker can answer "the release", so it must not fall below nearest
            # neighbour beyond its sampling error (it changes few guesses per η)
            assert pt["recovery"]["bayes"]["all"] >= pt["recovery"]["nn"]["all"] - 0.005, pt


def test_the_numbers_come_from_the_resource_not_the_code(tmp_path, monkeypatch):
    """Every shipped recovery is read from the JSON: none is written in rapt's source, and the
    answers follow the file when it changes."""
    doc = json.loads(SHIPPED.read_text())
    src = "\n".join(p.read_text() for p in Path(attack_table.__file__).parent.rglob("*.py"))
    for e in doc["backbones"].values():
        for pt in e["points"]:
            for rec in pt["recovery"].values():
                assert repr(rec["all"]) not in src
    pt = doc["backbones"]["minilm"]["points"][3]
    best = max(v["all"] for v in pt["recovery"].values())
    assert f"{best:.1%}" in table_line("minilm", pt["eta"])
    for v in pt["recovery"].values():
        v["all"] = 0.123456
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    assert strongest_at("minilm", pt["eta"], load_table(path)).recovery == 0.123456


# --------------------------------------------------------------------------- the CLI

TEXTS = ["the movie was good and fun", "a boring plot", "really great music", "the worst film",
         "it was a nice story", "dull and weak scene"] * 2


@pytest.fixture(scope="module")
def cli_setup(tmp_path_factory, tiny_tokenizer):
    tmp = tmp_path_factory.mktemp("attack_table_cli")
    folder = save_backbone(make_bert(tiny_tokenizer, seed=3), tmp / "bb")
    csv = tmp / "train.csv"
    csv.write_text("text,label\n" + "".join(f"{t},{i % 2}\n" for i, t in enumerate(TEXTS)))
    return folder, csv


def _patch(monkeypatch, name: str) -> dict:
    t = _table(name)
    monkeypatch.setattr(attack_table, "load_table", lambda path=None: t)
    return t


def test_privatize_prints_the_table_line_and_takes_target_ep(cli_setup, tmp_path, monkeypatch):
    folder, csv = cli_setup
    runner = CliRunner()
    # uniform noise, the table's own mechanism (the default's line: the end of this test)
    args = ["privatize", str(csv), str(tmp_path / "out.csv"), "--backbone", str(folder),
            "--protect", "all"]
    r = runner.invoke(app, [*args, "--eta", "60"])  # the shipped table does not hold it
    assert r.exit_code == 0, r.output
    assert f"best attacker we ran: not in the table, backbone '{folder}' is not in it" in r.output
    _patch(monkeypatch, str(folder))
    r = runner.invoke(app, [*args, "--eta", "50", "--json-report"])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("best attacker we ran"))
    assert line.startswith("best attacker we ran at η = 50.00: nearest neighbour recovers 35.0% of "
                           "the tokens") and line.endswith("(shipped table, public text, P "
                                                           "there 0.650)")
    # which attacker, and what the number is: an upper bound, not a measurement of privacy
    assert ("empirical privacy 0.650 = 1 − the best recovery of the attackers we ran (an upper "
            "bound on privacy), set by nearest neighbour") in line
    rep = json.loads([ln for ln in r.output.splitlines() if ln.startswith("{")][-1])
    assert rep["attack_table"]["recovery"] == 0.35
    # rapt's default, noise by kind: the same figure, said to be uniform noise at the
    # protected tokens' η
    r = runner.invoke(app, [*args[:-2], "--eta", "50"])
    assert r.exit_code == 0, r.output
    assert any(ln.startswith("protected tokens (the table's figure is uniform noise at their η): "
                             "best attacker we ran at η = 50.00: nearest neighbour recovers "
                             "35.0%") for ln in r.output.splitlines()), r.output
    r = runner.invoke(app, [*args, "--target-ep", "0.5", "--json-report"])
    assert r.exit_code == 0, r.output
    eta = eta_for_target_ep(str(folder), 0.5, _table(str(folder)))
    assert json.loads([ln for ln in r.output.splitlines() if ln.startswith("{")][-1])[
        "eta"] == pytest.approx(eta)
    assert "for empirical privacy ≥ 0.5 (1 − the best recovery of the attackers we ran" in r.output
    r = runner.invoke(app, [*args, "--target-ep", "0.5", "--eta", "50"])
    assert r.exit_code == 2 and "give --eta or --target-ep, not both" in r.output
    r = runner.invoke(app, [*args, "--target-ep", "0.95"])
    assert r.exit_code == 2 and "out of the table's reach" in r.output, r.output


def test_tune_takes_target_ep_and_prints_the_line(cli_setup, tmp_path, monkeypatch):
    folder, csv = cli_setup
    _patch(monkeypatch, str(folder))
    r = CliRunner().invoke(app, ["tune", str(csv), "--backbone", str(folder), "--out",
                                 str(tmp_path / "art"), "--target-ep", "0.4", "--epochs", "1",
                                 "--method", "prompt", "--num-virtual-tokens", "2",
                                 "--batch-size", "4", "--max-length", "32", "--noise-seed", "0"])
    assert r.exit_code == 0, r.output
    eta = eta_for_target_ep(str(folder), 0.4, _table(str(folder)))
    meta = json.loads((tmp_path / "art" / "config.json").read_text())["meta"]
    assert meta["eta"] == pytest.approx(eta)
    assert f"best attacker we ran at η = {eta:.2f}: " in r.output
    assert "(shipped table, public text" in r.output
