"""Privacy figures per kind of token: the privacy report's ``by_kind`` (all tokens, rare words,
personal data, frequent words), the privacy line, the rule, and what the console shows."""

from __future__ import annotations

import math

import pytest

from rapt.pipeline import Customization, Encoding
from rapt.privacy.by_kind import FREQUENT, PERSONAL, RARE, KindPolicy
from rapt.privacy.kind_recovery import CLASS_KINDS, privacy_by_class, recovery_by_class
from rapt.stats import wilson_interval

TEXTS = ["the movie was good and fun", "a boring plot with bad actors", "really great music",
         "the worst film ever", "it was a nice story", "dull and weak scene"] * 4


def test_recovery_by_class_counts_each_class_and_skips_specials():
    # ids 0 special; classes: personal, rare, frequent
    original = [0, 5, 6, 7, 8, 9, 0]
    guessed = [0, 5, 1, 7, 8, 2, 0]
    classes = [PERSONAL, PERSONAL, PERSONAL, RARE, RARE, FREQUENT, PERSONAL]
    got = recovery_by_class(original, guessed, classes, special_ids=[0])
    assert got["all"]["n_tokens"] == 5 and got["all"]["recovered"] == 3
    assert got["personal"]["n_tokens"] == 2 and got["personal"]["recovery"] == 0.5
    assert got["rare"]["recovery"] == 1.0 and got["frequent"]["recovery"] == 0.0
    lo, hi = wilson_interval(1, 2)
    assert got["personal"]["recovery_ci95"] == [lo, hi]
    with pytest.raises(ValueError, match="align"):
        recovery_by_class([1, 2], [1], [0, 0])


def test_a_kind_with_no_token_is_none_never_zero():
    rep = privacy_by_class([5, 6], [5, 7], [5, 6], [RARE, RARE], frequent_rank=1000)
    assert set(rep) == set(CLASS_KINDS)
    for kind in ("personal", "frequent"):
        assert rep[kind]["n_tokens"] == 0
        assert rep[kind]["empirical_privacy"] is None and rep[kind]["inversion_success"] is None
        assert rep[kind]["replacement_probability"] is None
        assert "no token" in rep[kind]["note"]
    rare = rep["rare"]
    assert rare["replacement_probability"] == 0.5 and rare["inversion_success"] == 1.0
    assert rare["empirical_privacy"] == 0.0 and rare["attacker"] == "nearest neighbour"
    lo, hi = wilson_interval(2, 2)
    assert rare["empirical_privacy_ci95"] == [1 - hi, 1 - lo]
    assert "1,000 most frequent public words" in rare["counts"]


def _classes_for(rows, special):
    """A made-up class per position: specials personal (as row_noise gives them), then
    personal, rare, frequent in turn."""
    return [[PERSONAL if t in special else (i % 3) for i, t in enumerate(r)] for r in rows]


@pytest.mark.parametrize("plain", [0, 3])
def test_measure_reports_each_kind_on_the_text_positions(tiny_bert, plain):
    tok = tiny_bert.tokenizer
    enc = (Encoding.sampled(tok, 32 + plain, plain, 1, len(TEXTS), seed=0) if plain
           else Encoding(32))
    custom = Customization.create(tiny_bert, enc, eta=120.0, noise_seed=1,
                                  privatizer_mode="exact")
    clean = custom.rows(TEXTS)
    private = custom.privatize(clean, measure=False)
    special = set(int(i) for i in tiny_bert.special_ids)
    classes = _classes_for(clean, special)
    rep = custom.measure(clean, private, classes=classes)
    by = rep["by_kind"]
    assert by["all"]["n_tokens"] == rep["n_tokens"]
    assert by["all"]["replacement_probability"] == pytest.approx(rep["replacement_probability"])
    assert by["all"]["inversion_success"] == pytest.approx(rep["inversion_success"])
    # brute force over the text positions
    tc, tp = enc.text_only(tok, clean), enc.text_only(tok, private)
    tcls = enc.text_only(tok, classes)
    for kind, c in (("personal", PERSONAL), ("rare", RARE), ("frequent", FREQUENT)):
        pairs = [(a, b) for r, s, k in zip(tc, tp, tcls, strict=True)
                 for a, b, x in zip(r, s, k, strict=True) if a not in special and x == c]
        assert by[kind]["n_tokens"] == len(pairs) > 0
        changed = sum(a != b for a, b in pairs) / len(pairs)
        assert by[kind]["replacement_probability"] == pytest.approx(changed)
        # nearest neighbour of an output token is that token: it recovers the unchanged ones
        assert by[kind]["empirical_privacy"] == pytest.approx(changed)
    assert sum(by[k]["n_tokens"] for k in ("personal", "rare", "frequent")) == rep["n_tokens"]


def test_measure_without_classes_has_no_figures_by_kind(tiny_bert):
    custom = Customization.create(tiny_bert, Encoding(32), eta=120.0, noise_seed=1,
                                  privatizer_mode="exact")
    custom.privatize(custom.rows(TEXTS[:3]))
    assert custom.privacy["by_kind"] is None
    assert {"eta", "replacement_probability", "inversion_success", "n_tokens"} <= set(
        custom.privacy)


class _Oracle:
    """A channel model that reads back the clean text of ``rows`` (an attacker stronger than
    nearest neighbour on every kind)."""

    attacker = "oracle"

    def __init__(self, text_rows):
        self.text_rows = text_rows

    def prepare_rows(self, texts):
        return [list(self.text_rows[i][:len(t)]) for i, t in enumerate(texts)]

    def reader(self, backbone):
        return backbone


def test_a_stronger_channel_sets_each_kinds_empirical_privacy(tiny_bert):
    custom = Customization.create(tiny_bert, Encoding(32), eta=120.0, noise_seed=1,
                                  privatizer_mode="exact")
    clean = custom.rows(TEXTS)
    private = custom.privatize(clean, measure=False)
    special = set(int(i) for i in tiny_bert.special_ids)
    custom.channel = _Oracle([[t for t in r if t not in special] for r in clean])
    rep = custom.measure(clean, private, classes=_classes_for(clean, special))
    for kind in ("all", "personal", "rare", "frequent"):
        assert rep["by_kind"][kind]["attacker"] == "oracle"
        assert rep["by_kind"][kind]["empirical_privacy"] == 0.0
        assert rep["by_kind"][kind]["inversion_success"] < 1.0  # nearest neighbour's stays
        assert rep["channel"]["by_kind"][kind]["recovery"] == 1.0


def _report(by_kind):
    return {"eta": 50.0, "replacement_probability": 0.6, "inversion_success": 0.4,
            "n_tokens": 1234, "target_p": None, "by_kind": by_kind}


def test_the_privacy_line_carries_rare_word_and_personal_data_privacy():
    from rapt.privacy.mechanism import privacy_line

    by = privacy_by_class([5, 6, 7, 8], [9, 6, 9, 9], [9, 6, 9, 9],
                          [RARE, RARE, FREQUENT, FREQUENT])
    line = privacy_line(_report(by))
    assert "nearest-neighbour inversion recovers 40.0%" in line
    assert "rare-word privacy 0.500 (nearest neighbour, 2 tokens)" in line
    assert "personal-data privacy: no such tokens" in line and "0.000" not in line
    assert "not measured" in privacy_line(_report(None))


def _declared(rare=0.652, personal=None):
    fig = {"empirical_privacy": 0.61, "ci95": [0.58, 0.64], "attacker": "nearest neighbour"}
    return {"all": fig,
            "rare": {**fig, "empirical_privacy": rare, "ci95": [0.6, 0.7]},
            "personal": {"empirical_privacy": personal, "ci95": None,
                         "attacker": "nearest neighbour"}}


@pytest.fixture()
def api(tmp_path, tiny_bert):
    from _service import add_key, make_app
    from fastapi.testclient import TestClient

    app = make_app(tmp_path, tiny_bert)
    key = add_key(tmp_path, "alice")
    with TestClient(app) as c:
        yield c, key


def _login(c, key):
    import re

    token = re.search(r'name="csrf" value="([^"]+)"', c.get("/console/login").text).group(1)
    c.post("/console/login", data={"csrf": token, "key": key}, follow_redirects=False)


def test_figures_measured_on_the_rows_are_refused_with_an_upload(api):
    """Private statistics never ride along: per-kind privacy measured on the user's rows (its
    interval widths alone tell how many personal-data tokens the rows hold) is refused."""
    from _service import hdr, upload_body

    c, key = api
    body = upload_body()
    body["privacy"]["by_kind"] = _declared()
    assert c.post("/v1/datasets", json=body, headers=hdr(key)).status_code == 422
    assert c.get("/v1/datasets", headers=hdr(key)).json() == []


def test_the_client_measures_each_kind_and_keeps_the_figures(tmp_path):
    from _service import add_key, service_bert, write_csv
    from fastapi.testclient import TestClient

    from rapt.client.client import RaptClient
    from rapt.service import Limits, ServiceConfig, create_app

    bb = service_bert()
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=["tiny"],
                        limits=Limits(max_seq_len=64), progress_interval_s=0.0)
    key = add_key(tmp_path)
    with TestClient(create_app(cfg, backbones={"tiny": bb})) as tc:
        c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, eta=50.0,
                       kind_policy=KindPolicy())
        did = c.upload(write_csv(tmp_path / "private.csv"), max_length=32, holdout=False)
        mine = c.last_privacy["by_kind"]
        assert mine["all"]["n_tokens"] == c.last_privacy["n_tokens"]
        assert sum(mine[k]["n_tokens"] for k in ("personal", "rare", "frequent")) == (
            mine["all"]["n_tokens"])
        stored = tc.get(f"/v1/datasets/{did}",
                        headers={"Authorization": f"Bearer {key}"}).json()["privacy"]
        d = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, eta=50.0)
        did = d.upload(write_csv(tmp_path / "private.csv"), max_length=32, holdout=False)
        assert d.last_privacy["by_kind"]["rare"]["n_tokens"] > 0  # measured, kept here
        default = tc.get(f"/v1/datasets/{did}",
                         headers={"Authorization": f"Bearer {key}"}).json()["privacy"]
    # uniform noise: no policy to declare, and nothing measured on the rows rides along
    assert stored["by_kind"] is None
    assert "empirical_privacy" not in str(stored) and "n_tokens" not in str(stored)
    # rapt's default policy: the policy and each class's η are declared, no statistic
    assert set(default["by_kind"]) <= {"protect", "frequent_rank", "class_eta", "eta_personal",
                                       "personal_rank"}
    assert default["by_kind"]["protect"] == "rare" and default["by_kind"]["personal_rank"] == (
        10_000)
    assert "empirical_privacy" not in str(default) and "n_tokens" not in str(default)


# ------------------------------------------------------------------- the attack table per kind

KIND_ETAS = [40.0, 80.0]


def _kind_table(with_kinds: bool = True, personal_tokens: int = 12) -> dict:
    from rapt.privacy.attack_table import parse_table

    points = []
    for i, eta in enumerate(KIND_ETAS):
        nn = {"all": 0.2 + 0.3 * i, "replaced": 0.0}
        bayes = {"all": 0.3 + 0.3 * i, "replaced": 0.1}
        pt = {"eta": eta, "p": 0.8 - 0.3 * i, "recovery": {"nn": nn, "bayes": bayes}}
        if with_kinds:
            pers = None if personal_tokens == 0 else 0.1 + 0.2 * i
            nn["by_kind"] = {"all": nn["all"], "rare": 0.4 + 0.2 * i, "personal": pers,
                             "frequent": 0.1}
            bayes["by_kind"] = {"all": bayes["all"], "rare": 0.3, "personal": None if pers is None
                                else 0.5, "frequent": 0.6}
            pt["n_tokens_by_kind"] = {"all": 100, "rare": 30, "personal": personal_tokens,
                                      "frequent": 58}
        points.append(pt)
    attackers = {"nn": {"name": "nearest neighbour"}, "bayes": {"name": "mechanism-aware Bayes"}}
    return parse_table({"format": "rapt-attack-table", "version": 1,
                        "backbones": {"bb": {"attackers": attackers, "points": points}}})


def test_the_table_answers_per_kind_with_each_kinds_strongest_attacker():
    from rapt.privacy.attack_table import strongest_at, table_line

    a = strongest_at("bb", 40.0, _kind_table())
    assert a.attacker == "bayes" and a.by_kind_reason is None
    rare, pers = a.by_kind["rare"], a.by_kind["personal"]
    assert (rare.attacker, rare.recovery, rare.n_tokens) == ("nn", 0.4, 30)
    assert (pers.attacker_name, pers.recovery) == ("mechanism-aware Bayes", 0.5)
    mid = strongest_at("bb", math.sqrt(40.0 * 80.0), _kind_table())
    assert mid.by_kind["rare"].recovery == pytest.approx(0.5)  # halfway in log η
    line = table_line("bb", 40.0, _kind_table())
    assert "rare-word privacy 0.600 (nearest neighbour, 30 tokens)" in line
    assert "personal-data privacy 0.500 (mechanism-aware Bayes, 12 tokens)" in line


def test_a_kind_absent_from_the_public_text_is_none_and_an_old_table_says_why():
    from rapt.privacy.attack_table import strongest_at, table_line

    a = strongest_at("bb", 40.0, _kind_table(personal_tokens=0))
    assert a.by_kind["personal"].recovery is None
    assert a.by_kind["personal"].empirical_privacy is None
    assert "personal-data privacy: no such tokens" in table_line("bb", 40.0,
                                                               _kind_table(personal_tokens=0))
    old = strongest_at("bb", 40.0, _kind_table(with_kinds=False))
    assert old.recovery == 0.3 and old.by_kind is None and "no figures per kind" in (
        old.by_kind_reason)
    assert "rare-word" not in table_line("bb", 40.0, _kind_table(with_kinds=False))


def test_the_shipped_table_is_read_with_or_without_kinds():
    from rapt.privacy.attack_table import load_table, strongest_at

    table = load_table()
    name = next(iter(table["backbones"]))
    pts = table["backbones"][name]["points"]
    a = strongest_at(name, pts[1]["eta"], table)
    assert a.recovery is not None
    assert (a.by_kind is None) == (a.by_kind_reason is not None)


@pytest.mark.parametrize("mutate, field", [
    (lambda pt: pt["recovery"]["nn"]["by_kind"].update(rare=1.5), "by_kind.rare"),
    (lambda pt: pt["recovery"]["nn"]["by_kind"].pop("personal"), "by_kind.personal"),
    (lambda pt: pt.pop("n_tokens_by_kind"), "n_tokens_by_kind"),
    (lambda pt: pt["n_tokens_by_kind"].update(personal=0), "no token of this kind"),
])
def test_a_bad_kind_figure_names_its_field(mutate, field):
    import json

    from rapt.privacy.attack_table import AttackTableError, parse_table

    doc = json.loads(json.dumps(_kind_table()))
    mutate(doc["backbones"]["bb"]["points"][0])
    with pytest.raises(AttackTableError, match=field):
        parse_table(doc)


# ------------------------------------------------------------------------------ the rule

def test_the_rule_carries_the_lowest_figure_per_kind_with_its_attacker(monkeypatch):
    from rapt.privacy import attack_table
    from rapt.privacy.rule import judge

    monkeypatch.setattr(attack_table, "load_table", lambda path=None: _kind_table())
    by = privacy_by_class([5, 6, 7, 8], [9, 6, 9, 9], [9, 6, 9, 9],
                          [RARE, RARE, FREQUENT, FREQUENT])  # rare 0.5, no personal token
    v = judge({**_report(by), "eta": 40.0}, backbone="bb", min_p=0.1)
    # table at η 40: rare 0.6 (nearest neighbour), personal 0.5 (Bayes); measured rare 0.5
    assert v.by_kind["rare"].empirical_privacy == pytest.approx(0.5)
    assert v.by_kind["rare"].attacker == "nearest neighbour on this release"
    assert v.by_kind["personal"].empirical_privacy == pytest.approx(0.5)
    assert v.by_kind["personal"].attacker == "mechanism-aware Bayes, rapt's attack table"
    weak = judge({**_report(by), "eta": 40.0}, backbone="bb", min_p=0.9)
    assert weak.weak and "rare-word privacy 0.500 (nearest neighbour on this release)" in (
        weak.message())
    assert "personal-data privacy 0.500 (mechanism-aware Bayes" in weak.message()
    # nothing per kind anywhere: nothing said
    monkeypatch.setattr(attack_table, "load_table",
                        lambda path=None: _kind_table(with_kinds=False))
    plain = judge({**_report(None), "eta": 40.0}, backbone="bb", min_p=0.9)
    assert plain.by_kind == {} and "rare-word" not in plain.message()


def test_the_console_shows_the_tables_figures_per_kind(api, monkeypatch):
    from _service import hdr, upload_body

    from rapt.privacy import attack_table

    c, key = api
    table = _kind_table()
    table["backbones"]["tiny"] = table["backbones"].pop("bb")
    monkeypatch.setattr(attack_table, "load_table", lambda path=None: table)
    body = upload_body()
    body["privacy"]["eta"] = 40.0
    assert c.post("/v1/datasets", json=body, headers=hdr(key)).status_code == 201
    _login(c, key)
    page = c.get("/console/datasets").text
    assert "rare-word privacy 0.600 (nearest neighbour, rapt&#39;s attack table)" in page


def test_the_table_benchmark_writes_per_kind_figures_that_the_reader_takes(tiny_bert):
    """bench_attack_table's pieces on a tiny table: the texts' classes, each attacker's
    recovery per kind at two η, parsed and answered as the shipped table would be."""
    from benchmarks.bench_attack_table import _kinds_table, attacked_classes, kind_figures
    from rapt.attacks.recovery import reconstruct
    from rapt.privacy.attack_table import parse_table, strongest_at
    from rapt.privacy.mechanism import tokenize_texts

    texts = ["the movie was good and fun", "a boring plot with bad actors",
             "really great music", "the worst film ever"]
    rows = [r[:4] for r in tokenize_texts(texts, tiny_bert.tokenizer)]
    classes, record = attacked_classes(rows, texts, tiny_bert.tokenizer)
    assert [len(c) for c in classes] == [len(r) for r in rows]
    assert record["frequent_rank"] == 1000 and "detector" in record["personal_data_detector"]
    points = []
    for eta in (30.0, 300.0):
        res = reconstruct(rows, tiny_bert, eta, ["nn"], seed=0, mode="exact", classes=classes)
        by_kind, counts = kind_figures(res)
        assert counts["all"] == sum(map(len, rows))
        for kind, c in (("personal", PERSONAL), ("rare", RARE), ("frequent", FREQUENT)):
            assert counts[kind] == sum(x == c for r in classes for x in r)
        # brute force: nearest neighbour's hits per class
        priv = res["attackers"]["nn"]
        assert by_kind["nn"]["all"] == pytest.approx(priv["all"])
        points.append({"eta": eta, "p": res["p"], "n_tokens_by_kind": counts,
                       "recovery": {"nn": {"all": priv["all"], "replaced": priv["replaced"],
                                           "by_kind": by_kind["nn"]}}})
    entry = {"attackers": {"nn": {"name": "nearest neighbour"}}, "points": points,
             "kinds": record}
    table = parse_table({"format": "rapt-attack-table", "version": 1,
                         "backbones": {"tiny": entry}})
    a = strongest_at("tiny", 300.0, table)
    for kind in ("rare", "frequent"):
        want = points[1]["recovery"]["nn"]["by_kind"][kind]
        assert (a.by_kind[kind].recovery is None) == (counts[kind] == 0)
        assert a.by_kind[kind].recovery == want
    assert any("rare-word privacy" in ln for ln in _kinds_table(entry))
