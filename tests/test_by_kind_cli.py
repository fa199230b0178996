"""Noise by kind of token for users: `rapt tune --protect rare` releases frequent words as they
are and noises rare ones, recording each class's η in the artifact; `--protect all` is today's
uniform release; bad values exit 2 naming the option; `rapt predict` reuses the tuned policy;
the client declares the policy with its upload and the service validates, stores and shows it."""

from __future__ import annotations

import json

import pytest
from _service import add_key, make_app, upload_body
from _tiny import SPECIALS, TOY_WORDS, WORDS, make_bert, toy_cli_inputs
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from rapt.cli import app
from rapt.pipeline import Customization, Encoding
from rapt.privacy.by_kind import KindPolicy

runner = CliRunner()
FREQUENT = ("good", "fun", "film", "bad", "great", "music")  # in the public list's top 1000
RARE = ("boring", "plot", "awful", "story")  # outside it


def _tune(bb, data, out, *extra) -> list[str]:
    return ["tune", str(data), "--out", str(out), "--backbone", bb, "--eta", "2",
            "--epochs", "1", "--batch-size", "8", "--noise-seed", "0", "--no-local",
            "--num-virtual-tokens", "2", "--method", "prompt", *extra]


class _Released:
    """Customization.tune and .privatize wrapped: the rows tuned on, and the policy of every
    privatize call."""

    def __init__(self, monkeypatch):
        self.rows, self.policies = [], []
        tune, privatize = Customization.tune, Customization.privatize

        def tune_(custom, rows, *a, **kw):
            self.rows.append([list(r) for r in rows])
            return tune(custom, rows, *a, **kw)

        def privatize_(custom, rows, **kw):
            self.policies.append(custom.kind_policy)
            return privatize(custom, rows, **kw)

        monkeypatch.setattr(Customization, "tune", tune_)
        monkeypatch.setattr(Customization, "privatize", privatize_)


@pytest.fixture(scope="module")
def rare_run(tmp_path_factory):
    """(tmp, backbone, data, OUT, the rows tuned on, output) of a `rapt tune --protect rare`."""
    tmp = tmp_path_factory.mktemp("bykind")
    bb, data = toy_cli_inputs(tmp, repeats=3)
    with pytest.MonkeyPatch.context() as mp:
        seen = _Released(mp)
        r = runner.invoke(app, _tune(bb, data, tmp / "rare", "--protect", "rare"))
    assert r.exit_code == 0, r.output
    return tmp, bb, data, tmp / "rare", seen.rows[0], r.output


def _words(tok, row) -> list[str]:
    return tok.convert_ids_to_tokens(row)


def test_tune_protect_rare_noises_rare_words_and_releases_frequent_ones(rare_run):
    from transformers import AutoTokenizer

    tmp, bb, data, out, rows, output = rare_run
    tok = AutoTokenizer.from_pretrained(bb)
    texts = [line.split(",")[0] for line in data.read_text().splitlines()[1:]]
    clean = Encoding(128).rows(tok, texts)
    assert len(rows) == len(clean)
    frequent = rare = rare_changed = 0
    for c, p in zip(clean, rows, strict=True):
        for a, b in zip(_words(tok, c), _words(tok, p), strict=True):
            if a in FREQUENT:
                frequent += 1
                assert b == a  # released in clear
            elif a in RARE:
                rare += 1
                rare_changed += b != a
    assert frequent > 0 and rare > 0
    assert rare_changed / rare > 0.5  # η = 2 on a 32-dim table replaces most tokens
    assert "frequent words pass in clear" in output


def test_tune_protect_rare_records_each_class_eta_in_the_artifact(rare_run):
    out = rare_run[3]
    rec = json.loads((out / "config.json").read_text())["meta"]["by_kind"]
    assert rec["protect"] == "rare" and rec["frequent_rank"] == 1000
    # personal data at η 0: --protect rare's default without a personal-data level
    assert rec["class_eta"] == {"personal": 0.0, "rare": 2.0, "frequent": None}
    assert rec["personal_rank"] == 10_000  # and the rarest words get personal data's η


def test_tune_protect_all_releases_exactly_the_uniform_mechanism(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    bb, data = toy_cli_inputs(tmp_path, repeats=2)
    seen = _Released(monkeypatch)
    r = runner.invoke(app, _tune(bb, data, tmp_path / "all", "--protect", "all"))
    assert r.exit_code == 0, r.output
    from rapt.models import load_backbone

    backbone = load_backbone(bb)
    tok = AutoTokenizer.from_pretrained(bb)
    texts = [line.split(",")[0] for line in data.read_text().splitlines()[1:]]
    before = Customization.create(backbone, Encoding(128), eta=2.0, noise_seed=0)
    monkeypatch.undo()
    assert seen.rows[0] == before.privatize(Encoding(128).rows(tok, texts), measure=False)
    meta = json.loads((tmp_path / "all" / "config.json").read_text())["meta"]
    assert meta["by_kind"] is None and seen.policies == [None]


@pytest.mark.parametrize(("extra", "flag"), [
    (["--protect", "rare", "--frequent-rank", "500"], "--frequent-rank"),
    (["--protect", "rare", "--other-eta", "1"], "--other-eta"),  # below --eta 2
    (["--protect", "rare", "--other-eta", "-3"], "--other-eta"),
    (["--protect", "secret"], "--protect"),
    (["--protect", "all", "--other-p", "0.2"], "--other-p"),  # not with --protect all
    (["--personal-p", "0"], "--personal-p"),
    (["--personal-p", "0.9", "--personal-eta", "0"], "--personal-eta"),
    (["--protect", "rare", "--personal-eta", "3"], "--personal-eta"),  # above --eta 2
    (["--personal-eta", "-1"], "--personal-eta"),
    (["--protect", "rare", "--personal-rank", "5000"], "--personal-rank"),
    (["--protect", "rare", "--frequent-rank", "10000", "--personal-rank", "1000"],
     "--personal-rank"),  # below --frequent-rank
    (["--protect", "all", "--personal-rank", "10000"], "--personal-rank"),  # no level
])
def test_bad_by_kind_options_exit_2_naming_the_option(rare_run, tmp_path, extra, flag):
    _, bb, data, *_ = rare_run
    r = runner.invoke(app, _tune(bb, data, tmp_path / "bad", *extra))
    assert r.exit_code == 2, r.output
    assert flag in r.output and "Traceback" not in r.output
    assert not (tmp_path / "bad").exists()


def test_predict_reuses_the_tuned_policy_unless_protect_is_given(rare_run, monkeypatch):
    _, _, data, out, *_ = rare_run
    seen = _Released(monkeypatch)
    r = runner.invoke(app, ["predict", str(out), str(data), "--noise-seed", "1",
                            "--limit", "4"])
    assert r.exit_code == 0, r.output
    assert seen.policies[-1] == KindPolicy("rare", 1000, None, 0.0, 10_000)
    assert "queries as the prompt was tuned" in r.output
    r = runner.invoke(app, ["predict", str(out), str(data), "--noise-seed", "1",
                            "--limit", "4", "--protect", "all"])
    assert r.exit_code == 0, r.output
    assert seen.policies[-1] == KindPolicy() and "queries as the prompt" not in r.output
    # a rank alone would be silently dropped for the recorded policy: refused
    r = runner.invoke(app, ["predict", str(out), str(data), "--personal-rank", "10000"])
    assert r.exit_code == 2 and "--personal-rank" in r.output and "--protect" in r.output


# -- the client's declaration and the service -------------------------------------------------

def _fast_bert():
    """The service's "tiny" backbone with a fast tokenizer (token classes need offsets)."""
    from transformers import BertTokenizerFast

    words = [w for w in WORDS if w != "actors"]
    tok = BertTokenizerFast(vocab={t: i for i, t in enumerate([*SPECIALS, *words])},
                            do_lower_case=True)
    return make_bert(tok, name="tiny", max_positions=256)


@pytest.fixture()
def service(tmp_path):
    bb = _fast_bert()
    key = add_key(tmp_path)
    with TestClient(make_app(tmp_path, bb)) as tc:
        yield tc, key, bb


DECL = {"mechanism": "dchi-text2text", "eta": 5.0, "embedding": "tiny", "nn_mode": "fast",
        "by_kind": {"protect": "rare", "frequent_rank": 1000,
                    "class_eta": {"personal": 5.0, "rare": 5.0, "frequent": None}}}


def test_the_client_declares_the_policy_and_the_console_shows_it(service, tmp_path):
    import re

    from _service import write_csv

    from rapt.client.client import RaptClient

    tc, key, bb = service
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, eta=5.0, seed=0,
                   kind_policy=KindPolicy("rare"))
    did = c.upload(write_csv(tmp_path / "d.csv"), max_length=32, holdout=False)
    assert c.dataset(did)["privacy"] == {**DECL, "by_kind": {**DECL["by_kind"],
                                                            "eta_personal": None,
                                                            "personal_rank": None}}
    csrf = re.search(r'name="csrf" value="([^"]+)"', tc.get("/console/login").text).group(1)
    tc.post("/console/login", data={"csrf": csrf, "key": key}, follow_redirects=False)
    page = tc.get("/console/datasets").text
    assert "by kind of" in page and "protect rare" in page and "frequent in clear" in page


def test_a_bad_declaration_is_a_422_naming_the_field_and_stores_nothing(service):
    tc, key, _ = service
    for by_kind, field in (({**DECL["by_kind"], "protect": "secret"}, "protect"),
                           ({**DECL["by_kind"], "frequent_rank": 500}, "frequent_rank"),
                           ({**DECL["by_kind"], "class_eta": {"personal": 5.0, "rare": 1.0,
                                                             "frequent": None}}, "class_eta"),
                           ({**DECL["by_kind"], "eta_personal": 6.0,
                             "class_eta": {"personal": 6.0, "rare": 5.0, "frequent": None}},
                            "eta_personal"),
                           ({**DECL["by_kind"], "eta_personal": 0.0}, "class_eta.personal"),
                           ({**DECL["by_kind"], "personal_rank": 500}, "personal_rank"),
                           ({**DECL["by_kind"], "frequent_rank": 10000, "personal_rank": 1000},
                            "personal_rank")):
        body = {**upload_body(), "privacy": {**DECL, "by_kind": by_kind}}
        r = tc.post("/v1/datasets", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 422, r.text
        assert field in r.json()["detail"]
    assert tc.get("/v1/datasets", headers={"Authorization": f"Bearer {key}"}).json() == []


def test_client_queries_take_the_policy_declared_with_the_prompt(service):
    from rapt.client.client import RaptClient

    tc, key, bb = service
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc)
    c._prompt_info["p1"] = {"privacy": DECL}  # what GET /v1/prompts/p1 answers
    assert c.query_eta("p1") == 5.0 and c.kind_policy == KindPolicy("rare")
    assert c.customization.by_kind
    given = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc,
                       kind_policy=KindPolicy())
    given._prompt_info["p1"] = {"privacy": DECL}
    given.query_eta("p1")
    assert given.kind_policy == KindPolicy() and not given.customization.by_kind


def test_the_help_says_what_rare_means_and_that_frequent_words_pass_in_clear():
    for cmd in (["tune"], ["predict"], ["privatize"], ["client", "upload"], ["client", "predict"],
                ["demo"]):
        text = " ".join(runner.invoke(app, [*cmd, "--help"], terminal_width=200).output.split())
        assert "--protect" in text and "--frequent-rank" in text, cmd
        assert "--other-p" in text and "--other-eta" in text, cmd
        assert "most frequent words of rapt's public word list" in text, cmd
        assert "pass in clear unless --other-p / --other-eta is given" in text, cmd


def test_the_toy_words_split_as_the_tests_assume():
    from rapt.privacy.kinds import load_word_frequencies

    freq = load_word_frequencies()
    assert all(freq.band(w) <= 1 for w in FREQUENT) and all(freq.band(w) >= 2 for w in RARE)
    assert set(FREQUENT + RARE) <= set(TOY_WORDS)


def test_privatize_protect_rare_writes_frequent_words_as_they_were(rare_run, tmp_path):
    _, bb, data, *_ = rare_run
    base = ["privatize", str(data), "--backbone", bb, "--eta", "2", "--noise-seed", "0",
            "--json-report"]
    r = runner.invoke(app, [*base[:2], str(tmp_path / "rare.csv"), *base[2:],
                            "--protect", "rare"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output.strip().splitlines()[-1])
    assert report["by_kind"]["class_eta"] == {"personal": 0.0, "rare": 2.0, "frequent": None}
    clean = [line.split(",")[0].split() for line in data.read_text().splitlines()[1:]]
    got = [line.split(",")[0].split() for line in
           (tmp_path / "rare.csv").read_text().splitlines()[1:]]
    kept = [b == a for c, p in zip(clean, got, strict=True) if len(c) == len(p)
            for a, b in zip(c, p, strict=True) if a in FREQUENT]
    assert kept and all(kept)
    outs = []
    for name, extra in (("rare.csv", []), ("all.csv", ["--protect", "all"]),
                        ("plain.csv", [])):
        r = runner.invoke(app, [*base[:2], str(tmp_path / name), *base[2:], *extra])
        assert r.exit_code == 0, r.output
        outs.append((tmp_path / name).read_text())
    # no --protect: rapt's default, --protect rare (personal data at η 0), not uniform noise
    assert outs[0] == outs[2] != outs[1]


def test_protect_rare_without_a_level_takes_the_protected_default(rare_run, tmp_path):
    """No level given: uniform noise (--protect all) at P 0.6, the protected classes of
    --protect rare, the default, at P 0.7 (rapt.privacy.rule.DEFAULT_PROTECTED_P), each η
    calibrated on rapt's public sample."""
    from rapt.models import load_backbone
    from rapt.privacy.mechanism import calibrate_eta_public
    from rapt.privacy.rule import DEFAULT_PROTECTED_P, DEFAULT_TARGET_P

    _, bb, data, *_ = rare_run
    etas = {}
    for name, extra, level in (("u.csv", ["--protect", "all"], DEFAULT_TARGET_P),
                               ("r.csv", [], DEFAULT_PROTECTED_P)):
        r = runner.invoke(app, ["privatize", str(data), str(tmp_path / name), "--backbone", bb,
                                "--noise-seed", "0", "--json-report", *extra])
        assert r.exit_code == 0, r.output
        assert f"P ≈ {level:g} (--target-p {level:g})" in r.output
        etas[name] = json.loads(r.output.strip().splitlines()[-1])["eta"]
    model = load_backbone(bb)
    assert etas["r.csv"] == pytest.approx(calibrate_eta_public(model, DEFAULT_PROTECTED_P))
    assert etas["u.csv"] == pytest.approx(calibrate_eta_public(model, DEFAULT_TARGET_P))
    assert etas["r.csv"] < etas["u.csv"]


def test_the_demo_takes_the_protected_default_level_too(tmp_path):
    import dataclasses

    from rapt.cli.demo_cmd import DemoOptions, _demo_config
    from rapt.privacy.rule import DEFAULT_PROTECTED_P, DEFAULT_TARGET_P

    blank = {f.name: None for f in dataclasses.fields(DemoOptions)}
    base = {**blank, "out": tmp_path, "benchmark_config": False, "min_p": 0.5,
            "protect": "all", "frequent_rank": 1000}
    assert _demo_config(DemoOptions(**base)).target_p == DEFAULT_TARGET_P
    assert _demo_config(DemoOptions(**{**base, "protect": "rare"})).target_p == (
        DEFAULT_PROTECTED_P)
    assert _demo_config(DemoOptions(**{**base, "protect": "rare", "target_p": 0.5})).target_p \
        == 0.5


def test_tune_measures_its_release_per_kind(rare_run):
    """`rapt tune` passes the rows' classes to its privacy report: the line carries rare-word
    privacy measured on the release, and the rule reads the protected kinds."""
    *_, output = rare_run
    assert "rare-word privacy" in output
    assert "rare-word and personal-data privacy not measured" not in output


def test_personal_data_at_eta_0_is_declared_stored_and_taken_back(service, tmp_path):
    """A client whose personal data gets η 0 declares it (class_eta.personal 0 and
    eta_personal 0); the service stores it, the console says so, and a client querying the
    prompt takes the same policy back."""
    import re

    from _service import write_csv

    from rapt.client.client import RaptClient

    tc, key, bb = service
    policy = KindPolicy("rare", eta_personal=0.0)
    c = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc, eta=5.0, seed=0,
                   kind_policy=policy)
    did = c.upload(write_csv(tmp_path / "d.csv"), max_length=32, holdout=False)
    got = c.dataset(did)["privacy"]["by_kind"]
    assert got["eta_personal"] == 0.0 and got["class_eta"]["personal"] == 0.0
    csrf = re.search(r'name="csrf" value="([^"]+)"', tc.get("/console/login").text).group(1)
    tc.post("/console/login", data={"csrf": csrf, "key": key}, follow_redirects=False)
    assert "η personal 0 (independent of the token)" in tc.get("/console/datasets").text
    q = RaptClient(api_key=key, backbone=bb, remote_backbone="tiny", http=tc)
    q._prompt_info["p1"] = {"privacy": c.dataset(did)["privacy"]}
    q.query_eta("p1")
    assert q.kind_policy == policy


def test_privatize_personal_p_1_records_eta_0_and_says_so(rare_run, tmp_path):
    _, bb, data, *_ = rare_run
    r = runner.invoke(app, ["privatize", str(data), str(tmp_path / "p.csv"), "--backbone", bb,
                            "--eta", "2", "--noise-seed", "0", "--json-report",
                            "--protect", "all", "--personal-p", "1"])
    assert r.exit_code == 0, r.output
    assert "personal data (Presidio) η = 0" in r.output
    report = json.loads(r.output.strip().splitlines()[-1])
    assert report["by_kind"]["protect"] == "all" and report["by_kind"]["eta_personal"] == 0.0
    assert report["by_kind"]["class_eta"] == {"personal": 0.0, "rare": 2.0, "frequent": 2.0}
    assert report["privacy"]["protected_kinds"] == ["rare", "personal"]


def test_every_command_with_protect_takes_every_level_option():
    import typer

    def walk(cmd, path=()):
        if hasattr(cmd, "list_commands"):  # a group (typer's own click, not the click package)
            for name, sub in cmd.commands.items():
                yield from walk(sub, (*path, name))
        else:
            yield " ".join(path), {o for p in cmd.params for o in getattr(p, "opts", [])}

    levels = {"--frequent-rank", "--other-p", "--other-eta", "--personal-p", "--personal-eta",
              "--personal-rank"}
    with_protect = {name: opts for name, opts in walk(typer.main.get_command(app))
                    if "--protect" in opts}
    assert {"tune", "predict", "privatize", "demo", "client upload", "client predict"} <= set(
        with_protect)
    assert {name: levels - opts for name, opts in with_protect.items() if levels - opts} == {}


def test_the_defaults_fill_in_only_what_was_not_given():
    """--protect not given: rare (all with --no-privacy); under rare, personal data without a
    level of its own gets --personal-p 1 (η 0) and, without --personal-rank, so do the words
    outside the 10,000 most frequent public words; a level or rank given (0: off), --protect
    all or personal, and --no-privacy are left as typed."""
    from rapt.cli._by_kind import KindOptions, with_defaults

    def filled(private=True, **given):
        k = with_defaults(KindOptions(**given), private=private)
        return k.protect, k.personal_p, k.personal_eta, k.personal_rank

    assert filled() == ("rare", 1.0, None, 10_000)
    assert filled(protect="rare") == ("rare", 1.0, None, 10_000)
    assert filled(protect="rare", personal_eta=3.0) == ("rare", None, 3.0, 10_000)
    assert filled(personal_p=0.9) == ("rare", 0.9, None, 10_000)
    assert filled(personal_rank=0) == ("rare", 1.0, None, 0)
    assert filled(personal_rank=1000) == ("rare", 1.0, None, 1000)
    assert filled(protect="all") == ("all", None, None, None)
    assert filled(protect="personal") == ("personal", None, None, None)
    assert filled(private=False) == ("all", None, None, None)
    assert filled(private=False, protect="rare") == ("rare", None, None, None)  # refused later
    # the CLI's copy of the default (its module must not import torch) is the library's
    from rapt.privacy.by_kind import default_policy, make_policy

    k = with_defaults(KindOptions())
    assert make_policy(50.0, k.protect, k.frequent_rank, personal_p=k.personal_p,
                       personal_rank=k.personal_rank) == default_policy()
    off = with_defaults(KindOptions(personal_rank=0))
    assert make_policy(50.0, off.protect, personal_p=off.personal_p,
                       personal_rank=off.personal_rank or None).personal_rank is None
