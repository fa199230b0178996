"""Issue 13 items 6-9, the user's path: one set of defaults (CLI, client, service), privacy
that every privatizing command shows and records (η, measured P, inversion success, the same
η for the same --target-p), a verbalizer that picks distinct label words by itself, and help
and errors written in the command line's own words.

Each test failed on the code before these changes (noted per test)."""

from __future__ import annotations

import json
import re
from importlib.resources import files

import pytest
import typer.main
from _tiny import (
    SPECIALS,
    TOY_WORDS,
    make_bert,
    make_bpe_tokenizer,
    make_llama,
    make_tokenizer,
    save_backbone,
)
from typer.testing import CliRunner

from rapt.cli import app
from rapt.config import DEFAULT_PRIVATIZER_MODE, TuneConfig
from rapt.tuning.heads import label_token_ids

runner = CliRunner()
PUBLIC = files("rapt").joinpath("resources/public_sample.txt").read_text(encoding="utf-8")


class Captured(Exception):
    """Raised by a patched function to hand its arguments to the test."""


def _params(*path: str) -> dict:
    """name -> click parameter of the command at ``path`` (e.g. "client", "tune")."""
    cmd = typer.main.get_command(app)
    for p in path:
        cmd = cmd.commands[p]
    return {p.name: p for p in cmd.params}


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny BERT whose vocabulary is every word of rapt's public text sample, so η
    calibrated on that sample sees real tokens (not [UNK])."""
    tmp = tmp_path_factory.mktemp("user_path")
    vocab = sorted(set(re.findall(r"[a-z0-9]+|[^\sa-z0-9]", PUBLIC.lower())) - {
        w.lower() for w in SPECIALS} | set(TOY_WORDS))
    tok = make_tokenizer(tmp, vocab)
    return save_backbone(make_bert(tok, seed=3), tmp / "bb")


@pytest.fixture()
def csv_file(tmp_path):
    f = tmp_path / "reviews.csv"
    f.write_text("text,label\n" + "".join(
        f"{t},{y}\n" for t, y in [("the movie was good", 1), ("a very boring plot", 0),
                                  ("the coffee maker heats up fast", 1),
                                  ("the sole started to peel", 0)] * 3))
    return f


# -- item 6: one set of defaults ----------------------------------------------------------------

def _cli_tune_config(monkeypatch, argv) -> TuneConfig:
    """The TuneConfig `rapt tune` builds (training itself is skipped)."""
    def capture(bb, rows, labels, n, cfg, **kw):
        raise Captured(cfg)

    monkeypatch.setattr("rapt.tuning.tune.tune", capture)
    r = runner.invoke(app, ["tune", *argv])
    assert isinstance(r.exception, Captured), r.output
    return r.exception.args[0]


def _client_tune_config(monkeypatch, argv) -> TuneConfig:
    """The TuneConfig the service would train with for `rapt client tune ...`: what the
    client sends, through the service's JobCreate and the worker's tune_config."""
    from rapt.config import tune_config
    from rapt.service.schemas import JobCreate

    def capture(self, dataset_id, *, method="prompt", reconstruction=None, **hyper):
        raise Captured({"dataset_id": dataset_id, "method": method, **(
            {} if reconstruction is None else {"reconstruction": reconstruction}), **{
            k: v for k, v in hyper.items() if v is not None}})

    monkeypatch.setattr("rapt.client.client.RaptClient.tune", capture)
    r = runner.invoke(app, ["client", "tune", "ds_x", "--url", "http://127.0.0.1:9", "--key",
                            "k", *argv])
    assert isinstance(r.exception, Captured), r.output
    return tune_config(JobCreate(**r.exception.args[0]).model_dump())


@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_cli_client_and_service_tune_defaults_agree(bert_dir, csv_file, monkeypatch, method):
    """`rapt tune`, `rapt client tune` (through the service) and the service's JobCreate build
    the same TuneConfig when no option is given, and it is TuneConfig's own default.
    Before: the client asked for 1 epoch at lr 0.001 with 20 virtual tokens (a majority-class
    model), `rapt tune` for 3 epochs at lr 0.02 with 150, the service's L_rec was a mean."""
    from rapt.config import tune_config
    from rapt.service.schemas import JobCreate

    local = _cli_tune_config(monkeypatch, [str(csv_file), "--backbone", str(bert_dir),
                                           "--method", method])
    remote = _client_tune_config(monkeypatch, ["--method", method])
    service = tune_config(JobCreate(dataset_id="d", method=method).model_dump())
    expected = TuneConfig(method=method).to_dict()
    assert local.to_dict() == expected
    assert remote.to_dict() == expected
    assert service.to_dict() == expected
    assert expected["epochs"] == 3 and expected["lr"] == {"prompt": 0.02, "prefix": 0.01}[method]


def test_privatizer_mode_and_reconstruction_defaults_agree():
    """One search mode (fast, certified exact) and reconstruction off everywhere; the same
    --reconstruction flag on `rapt tune`, `rapt client upload` and `rapt client tune`.
    Before: `rapt privatize --mode` and `rapt attack invert --mode` defaulted to exact, the
    client to exact."""
    import inspect

    from rapt.client.client import RaptClient
    from rapt.demo import DemoConfig
    from rapt.split import SplitConfig

    assert DEFAULT_PRIVATIZER_MODE == "fast"
    modes = {"privatize": _params("privatize")["mode"].default,
             "attack invert": _params("attack", "invert")["mode"].default,
             "tune": _params("tune")["privatizer_mode"].default,
             "client": inspect.signature(RaptClient).parameters["mode"].default,
             "demo": DemoConfig().privatizer_mode,
             "sap": SplitConfig().privatizer_mode}
    assert set(modes.values()) == {"fast"}, modes
    for path, default in ((("tune",), False), (("client", "upload"), False),
                          (("client", "tune"), None)):  # None: as the dataset was uploaded
        p = _params(*path)["reconstruction"]
        assert "--reconstruction" in p.opts and "--no-reconstruction" in p.secondary_opts
        assert p.default == default, path
    assert inspect.signature(RaptClient.upload).parameters["reconstruction"].default is False


# -- item 7: privacy you can see ----------------------------------------------------------------

@pytest.fixture()
def service(bert_dir, tmp_path, monkeypatch):
    """The in-process service on the tiny BERT; `rapt client` commands reach it (their
    httpx.Client is the TestClient)."""
    from _service import add_key
    from fastapi.testclient import TestClient

    from rapt.models import load_backbone
    from rapt.service import Limits, ServiceConfig, create_app

    name = str(bert_dir)
    cfg = ServiceConfig(db_path=tmp_path / "svc.db", backbones=[name],
                        limits=Limits(max_seq_len=64), progress_interval_s=0.0)
    key = add_key(tmp_path)
    with TestClient(create_app(cfg, backbones={name: load_backbone(name)})) as tc:
        def client(**kw):
            tc.headers.update(kw.get("headers") or {})
            return tc

        monkeypatch.setattr("rapt.client.client.httpx.Client", client)
        yield ["--url", "http://127.0.0.1:9", "--key", key]


def _json_line(output: str, key: str) -> dict:
    return json.loads(next(ln for ln in reversed(output.splitlines())
                           if ln.startswith("{") and f'"{key}"' in ln))


def _measured(out) -> dict:
    return json.loads(out.with_name(out.name + ".measured.NOT-PRIVATE.json").read_text())


def _privacy_ok(rep: dict, eta: float) -> None:
    assert rep["eta"] == pytest.approx(eta, rel=1e-12)
    assert 0.0 < rep["replacement_probability"] < 1.0 and rep["n_tokens"] > 0
    # a white-box nearest-neighbour attacker recovers exactly the unreplaced tokens
    assert rep["inversion_success"] == pytest.approx(1 - rep["replacement_probability"],
                                                     abs=0.02)


def test_every_privatizing_command_shows_and_records_eta_p_inversion(bert_dir, csv_file,
                                                                     tmp_path, service):
    """privatize, tune, predict, sap tune, client upload and client predict all print η, the
    measured P and the nearest-neighbour inversion success and record them (JSON report,
    artifact meta, sap.json); the same --target-p gives the same η in every command (one
    calibration on rapt's public sample), and `client predict` reuses the training η that the
    service recorded. Before: tune printed η only, predict nothing, `client upload` had no
    --target-p and `client predict` refused to run without --eta."""
    bb = ["--backbone", str(bert_dir)]
    r = runner.invoke(app, ["privatize", str(csv_file), str(tmp_path / "priv.csv"), *bb,
                            "--target-p", "0.5", "--json-report"])
    assert r.exit_code == 0, r.output
    rep = _json_line(r.output, "privacy")
    eta = rep["eta"]
    _privacy_ok(rep["privacy"], eta)
    assert rep["inversion_success"] == rep["privacy"]["inversion_success"]
    assert "nearest-neighbour inversion recovers" in r.output

    art = tmp_path / "art"
    r = runner.invoke(app, ["tune", str(csv_file), "--out", str(art), *bb, "--target-p", "0.5",
                            "--epochs", "1", "--num-virtual-tokens", "2", "--batch-size", "4"])
    assert r.exit_code == 0, r.output
    assert "measured P =" in r.stdout and "inversion recovers" in r.stdout
    assert "calibrated for P ≈ 0.5 on rapt's public text sample" in r.stdout
    assert "prompt prompt" not in r.output  # item 9: "saved prompt prompt to ..."
    meta = json.loads((art / "config.json").read_text())["meta"]
    assert meta["eta"] == eta and meta["privacy"]["target_p"] == 0.5
    # the folder states the level; what was measured on the rows lies beside it
    _privacy_ok(_measured(art)["privacy"], eta)

    r = runner.invoke(app, ["predict", str(art), str(csv_file), "--json-report"])
    assert r.exit_code == 0, r.output
    assert "nearest-neighbour inversion recovers" in r.stderr
    _privacy_ok(_json_line(r.stdout, "privacy")["privacy"], eta)

    r = runner.invoke(app, ["sap", "tune", str(csv_file), "--out", str(tmp_path / "sap"), *bb,
                            "--target-p", "0.5", "--epochs", "1", "--batch-size", "4"])
    assert r.exit_code == 0, r.output
    assert "inversion recovers" in r.stdout
    assert json.loads((tmp_path / "sap" / "sap.json").read_text())["privacy"]["eta"] == eta
    _privacy_ok(_measured(tmp_path / "sap")["privacy"], eta)

    r = runner.invoke(app, ["client", "upload", str(csv_file), *bb, "--target-p", "0.5",
                            "--max-length", "32", "--json-report", *service])
    assert r.exit_code == 0, r.output
    dataset_id = r.stdout.splitlines()[0]
    assert "inversion recovers" in r.stderr
    _privacy_ok(_json_line(r.stdout, "privacy")["privacy"], eta)

    r = runner.invoke(app, ["client", "tune", dataset_id, "--epochs", "1", "--batch-size", "4",
                            "--num-virtual-tokens", "2", "--wait", *service])
    assert r.exit_code == 0, r.output
    prompt_id = json.loads(r.stdout[r.stdout.index("{"):])["prompt_id"]
    # the whole file, not two short queries: with ~7 tokens, "none replaced" is likely enough
    # at P ≈ 0.5 (OS-entropy noise) to fail CI once in a while
    r = runner.invoke(app, ["client", "predict", prompt_id, str(csv_file), *bb, "--json-report",
                            *service])
    assert r.exit_code == 0, r.output
    assert f"η recorded on the service with prompt {prompt_id}" in r.stderr
    _privacy_ok(_json_line(r.stdout, "privacy")["privacy"], eta)


def test_one_weak_privacy_rule_in_every_privatizing_command(bert_dir, csv_file, tmp_path,
                                                           service):
    """Issue 32 item 3 / issue 28 item 5: at a weak level (P ≈ 0.25) every command that
    privatizes prints the same rule's warning; at a strong one (P ≈ 0.85) none does. Before,
    only `client upload` / `client predict` warned, and by a P threshold of their own."""
    bb = ["--backbone", str(bert_dir)]
    small = ["--epochs", "1", "--batch-size", "4"]
    # every token noised alike (the rule on the protected kinds: tests/test_by_kind.py)
    uniform = ["--protect", "all"]

    def weak(r) -> bool:
        assert r.exit_code == 0, r.output
        return "weak privacy on this" in r.stderr and "--min-p 0.5" in r.stderr

    for level, expect in (("0.25", True), ("0.85", False)):
        art, sap = tmp_path / f"art{level}", tmp_path / f"sap{level}"
        runs = {
            "privatize": ["privatize", str(csv_file), str(tmp_path / f"p{level}.csv"), *bb,
                          "--target-p", level, *uniform],
            "tune": ["tune", str(csv_file), "--out", str(art), *bb, "--target-p", level, *small,
                     "--num-virtual-tokens", "2", *uniform],
            "predict": ["predict", str(art), str(csv_file)],
            "sap tune": ["sap", "tune", str(csv_file), "--out", str(sap), *bb, "--target-p",
                         level, *small],
            "sap predict": ["sap", "predict", str(sap), str(csv_file)],
        }
        for name, argv in runs.items():
            assert weak(runner.invoke(app, argv)) is expect, (name, level)
    r = runner.invoke(app, ["client", "upload", str(csv_file), *bb, "--target-p", "0.25",
                            "--max-length", "32", *uniform, *service])
    assert "warning: weak privacy on this training data" in r.stderr, r.output
    # the threshold is the user's: --min-p 0.1 lets the same level pass
    r = runner.invoke(app, ["client", "upload", str(csv_file), *bb, "--target-p", "0.25",
                            "--max-length", "32", "--min-p", "0.1", *uniform, *service])
    assert r.exit_code == 0 and "weak privacy" not in r.stderr, r.output
    r = runner.invoke(app, ["privatize", str(csv_file), str(tmp_path / "q.csv"), *bb,
                            "--target-p", "0.25", "--min-p", "0.1", *uniform])
    assert r.exit_code == 0 and "weak privacy" not in r.stderr, r.output


def test_attack_invert_takes_target_p_with_the_same_calibration(bert_dir, csv_file, tmp_path):
    """Issue 32 item 7: `attack invert` took --eta only; --target-p gives the η every other
    command calibrates for that P (here: the one `privatize --target-p` reports)."""
    bb = ["--backbone", str(bert_dir)]
    r = runner.invoke(app, ["privatize", str(csv_file), str(tmp_path / "p.csv"), *bb,
                            "--target-p", "0.5", "--json-report"])
    eta = _json_line(r.output, "privacy")["eta"]
    r = runner.invoke(app, ["attack", "invert", str(csv_file), *bb, "--target-p", "0.5",
                            "--eta", "3", "--json-report"])
    assert r.exit_code == 0, r.output
    rows = _json_line(r.output, "results")["results"]
    assert [row["target_p"] for row in rows] == [None, 0.5]
    assert rows[0]["eta"] == 3.0 and rows[1]["eta"] == pytest.approx(eta, rel=1e-12)
    assert "(calibrated for P ≈ 0.5)" in r.output
    r = runner.invoke(app, ["attack", "invert", str(csv_file), *bb, "--target-p", "1.5"])
    assert r.exit_code == 2 and "--target-p" in r.output


def test_target_p_help_says_eta_is_calibrated_on_public_text():
    for path in (("privatize",), ("tune",), ("demo",), ("sap", "tune"), ("client", "upload")):
        assert "public text sample" in _params(*path)["target_p"].help, path


# -- item 8: a verbalizer that picks distinct words ---------------------------------------------

def test_label_token_ids_fall_back_to_words_without_a_leading_space():
    """SmolLM2-style byte-level BPE: " 0" and " 1" both start with "Ġ", "0" and "1" do not.
    Before: [Ġ, Ġ] and "label words share a first token"."""
    tok = make_bpe_tokenizer()
    assert label_token_ids(tok, ["0", "1"]) == tok.convert_tokens_to_ids(["0", "1"])
    # words that are distinct with a leading space keep it (what the LM continues with)
    merged = make_bpe_tokenizer(merges=("Ġ p", "Ġ n"))
    assert label_token_ids(merged, ["pos", "neg"]) == merged.convert_tokens_to_ids(["Ġp", "Ġn"])
    with pytest.raises(ValueError, match=r"'good', 'great' share a first token with a leading "
                                         r"space \(\[\d+, \d+\]\) and without one"):
        label_token_ids(tok, ["good", "great"])


@pytest.fixture(scope="module")
def bpe_llama_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bpe_llama")
    return save_backbone(make_llama(make_bpe_tokenizer(tmp / "tok"), max_positions=256),
                         tmp / "bb")


def test_tune_causal_lm_on_labels_0_1(bpe_llama_dir, tmp_path):
    """`rapt tune --backbone <causal LM>` on a CSV labelled 0/1 trains (the verbalizer picks
    "0"/"1" without the space) and predicts; labels whose words collide either way stop with
    one error line that asks for --label-words with an example.
    Before: "label words share a first token: [224, 224]"."""
    f = tmp_path / "digits.csv"
    f.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in [
        ("good film", 1), ("bad film", 0), ("fun plot", 1), ("dull plot", 0)] * 2))
    base = ["--backbone", str(bpe_llama_dir), "--epochs", "1", "--batch-size", "4",
            "--num-virtual-tokens", "2"]
    r = runner.invoke(app, ["tune", str(f), "--out", str(tmp_path / "a"), *base])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["predict", str(tmp_path / "a"), str(f)])
    assert r.exit_code == 0 and "accuracy" in r.output, r.output
    g = tmp_path / "words.csv"
    g.write_text("text,label\ngood film,great\nbad film,grim\n")
    r = runner.invoke(app, ["tune", str(g), "--out", str(tmp_path / "b"), *base])
    assert r.exit_code == 2, r.output
    err = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "--label-words" in err[0] and "e.g. --label-words" in err[0], err
    assert "Traceback" not in r.output
    r = runner.invoke(app, ["tune", str(g), "--out", str(tmp_path / "b"), *base,
                            "--label-words", "yes,no"])
    assert r.exit_code == 0, r.output


# -- item 9: the command line's own words -------------------------------------------------------

def _commands(cmd=None, path=()):
    cmd = cmd or typer.main.get_command(app)
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))
    yield path, cmd


@pytest.mark.parametrize("path", [p for p, _ in _commands()], ids=" ".join)
def test_help_at_80_columns(path):
    """Every command's --help at COLUMNS=80: every option name whole (no "--num-virtual-toke…"),
    no "--no-no-...", no doubled word, and literal square brackets kept ("[unused]").
    Before: rich cut names and ate "[unused]"; `predict` had --no-no-privatize."""
    cmd = dict(_commands())[path]
    r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    text = r.output
    for p in cmd.params:
        for opt in p.opts + p.secondary_opts:
            if opt.startswith("--"):
                assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text), (opt, text)
    assert "…" not in text and "--no-no-" not in text
    assert not re.search(r"\b(\w+) \1\b", text), re.search(r"\b(\w+) \1\b", text)
    assert max(len(line) for line in text.splitlines()) <= 80
    if path == ("privatize",):
        assert "special and [unused] tokens" in " ".join(text.split())


@pytest.mark.parametrize("argv,expected", [
    (["demo", "--train-size", "0"], "--train-size must be >= 1"),
    (["tune", "CSV", "--num-virtual-tokens", "0"], "--num-virtual-tokens must be >= 1"),
    (["tune", "CSV", "--head", "verbalizer"], "--head verbalizer needs --label-words"),
    (["tune", "CSV", "--eta", "5", "--target-p", "0.4"], "give --eta or --target-p, not both"),
    (["client", "upload", "CSV", "--eta", "5", "--no-privacy", "--url", "http://127.0.0.1:9",
      "--key", "k"], "give it or a level (--eta, --target-p, --target-ep), not both"),
])
def test_errors_name_flags_not_python_keywords(bert_dir, csv_file, argv, expected):
    """Before: "DemoConfig.train_size", "TuneConfig.num_virtual_tokens",
    "TuneConfig.head='verbalizer' needs label_words", "give either eta or no_privacy=True"."""
    argv = [str(csv_file) if a == "CSV" else a for a in argv]
    if argv[0] == "tune":
        argv += ["--backbone", str(bert_dir)]
    r = runner.invoke(app, argv)
    assert r.exit_code == 2, r.output
    assert expected in r.output and "Traceback" not in r.output, r.output
    assert not re.search(r"\w+Config\.|\b\w+=(True|'|\d)", r.output), r.output


def test_flag_words_leaves_paths_alone():
    from rapt.cli._app import flag_words

    cmd = typer.main.get_command(app).commands["tune"]
    with typer.Context(cmd):
        assert flag_words("/data/text_column.csv: needs label_words. TuneConfig.lr='x'") == \
            "/data/text_column.csv: needs --label-words. --lr x"
