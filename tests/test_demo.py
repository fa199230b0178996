"""`rapt demo` end to end on a tiny setting (a small random BERT over MiniLM's tokenizer)."""

from __future__ import annotations

import json
import math

import pytest


def _texts(shared_data, split: str, n: int) -> list[str]:
    """The demo's subset (same seed) of sst2-sentences, to count its tokens."""
    from rapt.data import load_dataset

    return load_dataset("sst2-sentences", split).subset(n, seed=0).texts


def test_run_demo_tiny(small_bert, shared_data, monkeypatch):
    """The demo end to end; the privacy it reports is the privacy it was asked for.

    P (measured on the ~850 training tokens) must be within 0.05 of the target (η is
    calibrated on rapt's public text sample, which puts P on SST-2 about 0.03 above the target
    for this backbone; binomial s.e. ≈ 0.017), and the inversion attack's empirical privacy on
    the test tokens must match P within 4 standard errors of the two samples.

    Mutations tried (each made this test fail): the demo privatizing at ``eta * 1.25`` instead
    of the calibrated η (P ≈ 0.26); ``calibrate_eta_public`` asked for ``target_p / 2``
    (P ≈ 0.27).
    """
    from rapt.data import load_dataset
    from rapt.demo import (
        FUSED_SETTING,
        LOCAL_SETTING,
        DemoConfig,
        format_table,
        make_plot,
        run_demo,
    )
    from rapt.local import LocalBaseline

    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    cfg = DemoConfig(train_size=48, test_size=24, max_length=24, plain_len=4, epochs=1,
                     batch_size=16, target_p=0.5, privatizer_mode="exact", noise_seed=0,
                     seeds=2)
    steps: list[tuple[str, dict]] = []
    logs: list[str] = []
    res = run_demo(cfg, log=logs.append, progress=lambda s, r: steps.append((s, r)),
                   backbone=small_bert)
    # the shipped attack table's line beside P: a tiny test backbone is not in it, and says so
    assert sum(s.startswith("best attacker we ran: not in the table") for s in logs) == 1
    assert [r["setting"] for r in res.rows] == ["no privacy", "head only", "+privatization",
                                                "+reconstruction", LOCAL_SETTING, FUSED_SETTING]
    assert all(len(r["accuracies"]) == 2 and 0.0 <= r["accuracy"] <= 1.0 for r in res.rows)
    assert [r.get("steps") for r in res.rows] == [3, 0, 3, 3, None, None]  # head only: none
    # the user's side: the local model on the clean rows, scored on the clean test queries
    local = LocalBaseline.fit(_texts(shared_data, "train", 48),
                              load_dataset("sst2-sentences", "train").subset(48, seed=0).labels,
                              2, seed=0)
    test = load_dataset("sst2-sentences", "dev").subset(24, seed=0)
    assert res.rows[4]["accuracies"][0] == pytest.approx(
        float((local.predict(test.texts) == test.labels).mean()))
    # the paired difference is the mean of the per-seed differences
    rec, priv = res.rows[3]["accuracies"], res.rows[2]["accuracies"]
    assert res.paired["n"] == 2
    assert res.paired["mean_diff"] == pytest.approx((rec[0] - priv[0] + rec[1] - priv[1]) / 2)
    assert res.verdict.startswith("reconstruction ") and "2 paired seeds" in res.verdict
    assert res.head == "label-description"  # RAPT's encoder default: the prompt carries the task
    assert abs(res.p - 0.5) <= 0.05 and res.eta > 0, res.p  # η calibrated for P = 0.5
    # the inversion attack recovers exactly the unreplaced tokens (same embedding matrix), so
    # its empirical privacy is the test rows' P: the same rate, measured on other tokens
    tok = small_bert.tokenizer
    n_train = sum(len(tok(t)["input_ids"][:24]) - 2 for t in _texts(shared_data, "train", 48))
    n_test = sum(len(tok(t)["input_ids"][:24]) - 2 for t in _texts(shared_data, "dev", 24))
    se = math.sqrt(res.p * (1 - res.p) * (1 / n_train + 1 / n_test))
    assert abs(res.inversion_privacy - res.p) < 4 * se, (res.inversion_privacy, res.p, se)
    assert 0.25 < res.inversion_privacy < 0.75  # not the degenerate 0 (or 1) of a broken attack
    assert {s for s, _ in steps} == {f"{n}, seed {i}" for i in (0, 1)
                                     for n in ("no privacy", "+privatization", "+reconstruction")}
    assert len(res.rows[3]["rec_acc_end"]) == 2
    # every stage timed once in the log and in the result (issue 31 item 3), and they add up
    stages = res.stage_seconds
    assert list(stages) == ["backbone", "data", "calibration", "privatization",
                            "inversion attack", "tuning", "prediction", "local model"]
    assert all(v >= 0 for v in stages.values()) and sum(stages.values()) <= res.seconds
    assert sum(s.startswith("time per stage: backbone") for s in logs) == 1
    table = format_table(res)
    assert "time per stage: " in table
    assert "+reconstruction" in table and res.verdict in table
    assert "| 0 | 0 |" in table.splitlines()[2]  # the no-privacy row claims no privacy
    assert f"| {LOCAL_SETTING} |" in table and "| nothing sent | - |" in table
    assert f"| {FUSED_SETTING} |" in table and "four fifths of the test rows" in table
    make_plot(res)
    json.dumps(res.as_dict())


@pytest.mark.integration
def test_demo_cli_minilm(tmp_path, shared_data, monkeypatch):
    from typer.testing import CliRunner

    from rapt.cli import app

    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    out = tmp_path / "demo"
    r = CliRunner().invoke(app, ["demo", "--paper", "--out", str(out), "--train-size", "32",
                                 "--test-size", "16", "--epochs", "1", "--max-length", "24",
                                 "--plain-len", "4", "--eta", "60", "--seeds", "2"])
    assert r.exit_code == 0, r.output
    assert "+reconstruction" in r.output and "2 paired seeds" in r.output
    saved = json.loads((out / "results.json").read_text())
    assert saved["config"]["train_size"] == 32 and saved["config"]["plain_len"] == 4
    for f in ("results.json", "results.md", "demo.png"):
        assert (out / f).is_file()
    assert "time per stage: " in r.output and "plot: " in r.output
    assert "plot" in saved["stage_seconds"]


def test_demo_config_benchmark_and_validation():
    from rapt.demo import DemoConfig

    b = DemoConfig.benchmark(seeds=2)
    assert (b.train_size, b.test_size, b.epochs, b.batch_size, b.seeds) == (1000, 400, 4, 8, 2)
    assert (b.plain_len, b.rec_reduction, b.head, b.method) == (40, "sum", "auto", "prefix")
    d = DemoConfig()
    # Sized for ≤ 3 min on 2 cores (issue 31): 3 seeds × 150 steps ran in 2.6 min in bf16.
    assert d.train_size * d.epochs // d.batch_size * d.seeds <= 450
    with pytest.raises(ValueError, match="target_p"):
        DemoConfig(target_p=1.0)
    with pytest.raises(ValueError, match="seeds"):
        DemoConfig(seeds=0)
    DemoConfig(personal_rank=0)  # --personal-rank 0: off, as the help says
    with pytest.raises(ValueError, match="personal_rank"):
        DemoConfig(protect="rare", personal_rank=5000)


def test_demo_cli_bad_head_is_a_clear_error(tmp_path):
    from typer.testing import CliRunner

    from rapt.cli import app

    r = CliRunner().invoke(app, ["demo", "--paper", "--out", str(tmp_path / "d"), "--head",
                                 "mlm"])
    assert r.exit_code != 0 and "--head must be" in r.output and "Traceback" not in r.output
