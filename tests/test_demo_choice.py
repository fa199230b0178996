"""`rapt demo` (the user's choice: uniform against by-kind noise, local model, fused) on a tiny
setting: a small random BERT over MiniLM's tokenizer, Presidio's pattern recognizers only."""

from __future__ import annotations

import json

import numpy as np
import pytest

TINY = dict(train_size=48, test_size=24, max_length=24, epochs=1, batch_size=16, seeds=2,
            noise_seed=0)


@pytest.fixture()
def patterns_only(monkeypatch):
    """Presidio without spaCy's model: the demo's by-kind arm and its per-kind privacy run on
    the pattern recognizers (seconds saved per test, the same code path)."""
    pytest.importorskip("presidio_analyzer")
    import rapt.pipeline.customization as cu
    from rapt.privacy.personal_data import PersonalDataDetector

    det = PersonalDataDetector(ner_model=None)
    monkeypatch.setattr(cu, "shared_detector", lambda: det)


def test_the_choice_runs_both_arms_beside_the_local_model(small_bert, shared_data, monkeypatch,
                                                          patterns_only):
    from rapt.data import load_dataset
    from rapt.demo_choice import (
        ARMS,
        LOCAL,
        ChoiceConfig,
        format_table,
        fused_name,
        make_plot,
        remote_name,
        run_choice,
    )
    from rapt.local import LocalBaseline

    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    logs: list[str] = []
    steps: list[str] = []
    res = run_choice(ChoiceConfig(**TINY), log=logs.append,
                     progress=lambda name, r: steps.append(name), backbone=small_bert)
    names = [r["setting"] for r in res.rows]
    assert set(names) == {LOCAL, *(f(a) for a in ARMS for f in (remote_name, fused_name))}
    assert all(len(r["accuracies"]) == 2 and 0 <= r["accuracy"] <= 1 for r in res.rows)
    # 48 rows at batch 16, one epoch: 3 steps per arm and seed, each reported
    assert len(steps) == 2 * 2 * 3 and steps[0] == "uniform, seed 0"
    # the local model is the one a user fits on the clean rows, scored on the clean queries
    train = load_dataset("sst2-sentences", "train").subset(48, seed=0)
    test = load_dataset("sst2-sentences", "dev").subset(24, seed=0)
    local = LocalBaseline.fit(train.texts, train.labels, 2, seed=0).predict_proba(test.texts)
    want = float((local.argmax(-1) == np.asarray(test.labels)).mean())
    assert next(r for r in res.rows if r["setting"] == LOCAL)["accuracies"] == [want, want]
    # privacy per kind for each arm; the by-kind arm leaves frequent words in clear, so it
    # replaces fewer tokens, and its protected classes get the stronger level's η
    uni, kind = res.arms["uniform"], res.arms["by kind"]
    assert set(uni["privacy"]) == {"all", "rare", "personal"}
    assert uni["privacy"]["all"] is not None and uni["n_tokens"]["all"] > 100
    assert kind["p_measured"] < uni["p_measured"]
    assert kind["class_eta"]["frequent"] is None and kind["class_eta"]["rare"] == kind["eta"]
    assert kind["class_eta"]["personal"] == 0.0  # rapt's default: personal data at η 0
    assert any("by kind" in m and "uniformly drawn token (η 0)" in m for m in logs)
    assert kind["eta"] < uni["eta"]  # P 0.7's η is below P 0.6's: more noise
    assert kind["report"]["protected_kinds"] == ["rare", "personal"]
    assert set(res.verdicts) == set(ARMS) and all("On your data" in v
                                                  for v in res.verdicts.values())
    assert {"fused: by kind × local − local TF-IDF (clean, on your machine)"} <= set(res.paired)
    table = format_table(res)
    assert "| privacy: all | rare words | personal data |" in table and "nothing sent" in table
    make_plot(res)
    json.dumps(res.as_dict(), default=float)  # results.json must be writable
    assert "time per stage: " in logs[-1]


def test_the_choice_refuses_bad_sizes_and_levels():
    from rapt.demo_choice import ChoiceConfig

    with pytest.raises(ValueError, match="train_size"):
        ChoiceConfig(train_size=0)
    with pytest.raises(ValueError, match="protected_p"):
        ChoiceConfig(protected_p=1.0)


def test_a_sentence_pair_dataset_is_refused_before_any_work(small_bert, shared_data,
                                                            monkeypatch):
    from rapt.demo_choice import ChoiceConfig, run_choice

    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    with pytest.raises(ValueError, match="cb holds sentence pairs"):
        run_choice(ChoiceConfig(**{**TINY, "dataset": "cb"}), log=lambda s: None,
                   backbone=small_bert)


def test_the_default_demo_refuses_the_ablations_options(tmp_path):
    from typer.testing import CliRunner

    from rapt.cli import app

    r = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "d"), "--plain-len", "4",
                                 "--head", "linear"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "--plain-len, --head: options of RAPT's ablation; add --paper" in r.output


def test_the_cli_writes_the_table_the_verdicts_and_the_plot(tmp_path, monkeypatch):
    """The CLI layer over run_choice (faked: the run itself is tested above)."""
    from typer.testing import CliRunner

    import rapt.demo_choice as dc
    from rapt.cli import app

    seen = {}

    def fake_run(cfg, log, progress):
        seen["cfg"] = cfg
        rows = [{"setting": n, "accuracy": 0.7, "ci95": 0.01, "accuracies": [0.7, 0.7]}
                for n in (dc.LOCAL, *(f(a) for a in dc.ARMS for f in (dc.remote_name,
                                                                      dc.fused_name)))]
        report = {"eta": 60.0, "replacement_probability": 0.6, "inversion_success": 0.4,
                  "by_kind": None}
        arms = {a: {"privacy": {"all": 0.6, "rare": 0.5, "personal": 0.7}, "report": report,
                    "eta": 60.0, "target_p": 0.6} for a in dc.ARMS}
        return dc.ChoiceResult(config={"seeds": 2, "test_size": 10}, arms=arms, rows=rows,
                               verdicts={a: "On your data ..." for a in dc.ARMS})

    monkeypatch.setattr(dc, "run_choice", fake_run)
    out = tmp_path / "d"
    r = CliRunner().invoke(app, ["demo", "--out", str(out), "--seeds", "2", "--train-size",
                                 "100"])
    assert r.exit_code == 0, r.output
    assert (seen["cfg"].seeds, seen["cfg"].train_size) == (2, 100)
    assert "| privatized LoRA, by kind | 70.0 ± 1.0 | 60.0 % | 50.0 % | 70.0 % |" in r.output
    assert "by kind: On your data" in r.output
    assert "uniform: every token at η 60.00 (P ≈ 0.6 on public text)" in r.output
    assert json.loads((out / "results.json").read_text())["verdicts"]["uniform"]
    assert (out / "demo.png").stat().st_size > 0 and (out / "results.md").is_file()
