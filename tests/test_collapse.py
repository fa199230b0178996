"""No silent collapse (issue 32 item 4): after training and after predict, a warning when the
predictions are near-constant or no better than the majority class, with what to change."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rapt.cli import app
from rapt.stats import collapse_warnings


def test_near_constant_and_majority_rate():
    names = ["neg", "neu", "pos"]
    # FP with DP in issue 32: one class for 399 of 400 rows
    pred = [1] * 399 + [0]
    gold = [1] * 240 + [0] * 100 + [2] * 60
    msgs = collapse_warnings(pred, gold, names)
    assert len(msgs) == 2
    assert "'neu' for 399 of 400 rows (99.8%)" in msgs[0]
    assert "accuracy 60.0 %" in msgs[1] and "majority rate 60.0 % ± 4.8 points" in msgs[1]
    # a model that learnt: varied predictions, accuracy well above the majority rate
    good = gold[:340] + [2] * 60
    assert collapse_warnings(good, gold, names) == []
    # above the majority rate but inside its CI: still no better than guessing
    def right_on(k: int) -> list[int]:  # the first k rows right, the others wrong
        return [g if i < k else (g + 1) % 3 for i, g in enumerate(gold)]

    inside = collapse_warnings(right_on(252), gold, names)  # 0.630 vs 0.600 ± 0.048
    assert len(inside) == 1 and "accuracy 63.0 % is within the 95% CI" in inside[0]
    assert collapse_warnings(right_on(268), gold, names) == []  # 0.670: outside
    assert collapse_warnings(right_on(252), gold, names, level=0.5) == []  # ± 0.017
    # no gold labels: only the near-constant check; tiny inputs are not judged constant
    assert len(collapse_warnings(pred, None, names)) == 1
    assert collapse_warnings([0] * 9, None, names) == []


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, toy_backbone):
    tmp = tmp_path_factory.mktemp("collapse")
    bb = toy_backbone
    skew = tmp / "skew.csv"
    skew.write_text("text,label\n" + "good film,pos\n" * 19 + "bad film,neg\n")
    sep = tmp / "sep.csv"
    sep.write_text("text,label\n" + "good fun film,pos\nbad boring plot,neg\n" * 10)
    return tmp, str(bb), skew, sep


def test_tune_warns_after_training_when_the_model_collapsed(tiny):
    """19 of 20 rows 'pos', one epoch: the model answers 'pos' everywhere and says so; the
    negative control (separable rows, LoRA, 8 epochs) learns and prints no such warning."""
    tmp, bb, skew, sep = tiny
    base = ["--backbone", bb, "--num-virtual-tokens", "2"]
    r = CliRunner().invoke(app, ["tune", str(skew), "--out", str(tmp / "a"), *base,
                                 "--epochs", "1", "--no-privacy"])
    assert r.exit_code == 0, r.output
    assert "warning: after training (predictions on 20 training rows): predictions are " \
           "near-constant: 'pos' for 20 of 20 rows" in r.stderr
    assert "within the 95% CI of the majority rate 95.0 %" in r.stderr
    assert "what to try: more epochs (--epochs)" in r.stderr
    # the advice fits this run: LoRA (the default) on clear text
    advice = r.stderr[r.stderr.index("what to try:"):].splitlines()[0]
    assert "--method lora" not in advice and "privacy level" not in advice
    assert "issue" not in r.stderr
    r = CliRunner().invoke(app, ["tune", str(sep), "--out", str(tmp / "b"), *base,
                                 "--no-privacy", "--method", "lora", "--epochs", "8",
                                 "--lr", "0.01", "--batch-size", "4"])
    assert r.exit_code == 0, r.output
    assert "after training" not in r.stderr and "what to try" not in r.stderr
    # predict on the collapsed prompt warns too (shared by sap predict and client predict)
    r = CliRunner().invoke(app, ["predict", str(tmp / "a"), str(sep)])
    assert r.exit_code == 0, r.output
    assert "warning: these predictions: predictions are near-constant" in r.stderr
    assert "accuracy 50.0 % is within the 95% CI" in r.stderr


def test_service_jobs_check_their_training_rows_and_the_client_says_so(tiny, tmp_path,
                                                                       capsys):
    """`client tune --wait` (issue 32 items 4 and 5): the service's job runner predicts the
    training rows after tuning and the prompt's info carries the head and the warnings; the
    client prints them with this machine's label names. Skewed rows collapse; separable rows
    under LoRA do not."""
    from types import SimpleNamespace

    from rapt.cli.client_cmd import _echo_training_check
    from rapt.models import load_backbone
    from rapt.service.routes.prompts import _info
    from rapt.service.worker import TrainData, default_runner

    _, bb_dir, skew, sep = tiny
    bb = load_backbone(bb_dir)

    def job(csv, **params):
        lines = csv.read_text().splitlines()[1:]
        texts, labels = zip(*(ln.rsplit(",", 1) for ln in lines), strict=True)
        ids = [bb.tokenizer(t)["input_ids"] for t in texts]
        y = [["neg", "pos"].index(lab) for lab in labels]
        none = lambda *a, **k: None  # noqa: E731
        tuned = default_runner(bb, TrainData(ids, y, 2, None), params, progress=none,
                               should_stop=lambda: False, checkpoint=none, resume=None)
        folder = tmp_path / csv.stem
        tuned.save(folder)
        return _info({"id": "pr_1", "job_id": "jb_1", "backbone": "tiny", "num_labels": 2,
                      "method": params["method"], "reconstruction": False, "plain_ids": None,
                      "created": 0.0, "path": str(folder)})

    collapsed = job(skew, method="prompt", num_virtual_tokens=2, epochs=1)
    assert collapsed.head == "linear"
    assert any("'label 1' for 20 of 20 rows" in m for m in collapsed.training_warnings)
    learnt = job(sep, method="lora", epochs=8, lr=0.01, batch_size=4)
    assert learnt.training_warnings == []
    # a prompt whose folder is gone answers with its row alone
    assert _info({**collapsed.model_dump(), "path": str(tmp_path / "gone")}).head is None

    client = SimpleNamespace(prompt=lambda pid: collapsed.model_dump(),
                             label_names_for=lambda pid: ["neg", "pos"])
    _echo_training_check(client, {"prompt_id": "pr_1", "epsilon": None},
                         collapsed.model_dump())
    err = capsys.readouterr().err
    assert "predictions are near-constant: 'pos' for 20 of 20 rows" in err
    assert "what to try:" in err
