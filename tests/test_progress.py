"""Issue 32 item 6: quiet, readable output. One progress bar helper (tqdm on a terminal, a
line every 10 % in a file or pipe), the task loss and L_rec apart, no CI for one seed, and the
demo's task losses on their own axis."""

from __future__ import annotations

import io
import json

import pytest
from typer.testing import CliRunner

from rapt.cli import app
from rapt.progress import LineProgress, progress_bar


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_file_gets_a_line_every_tenth_and_no_carriage_returns():
    out = io.StringIO()
    bar = progress_bar(total=200, desc="tune", unit="step", file=out)
    assert isinstance(bar, LineProgress)
    for _ in range(200):
        bar.set_postfix(loss="0.5")
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 11 and lines[0].startswith("tune: 10% (20/200 steps)")
    assert lines[9].startswith("tune: 100% (200/200 steps)") and "loss=0.5" in lines[9]
    assert lines[10].startswith("tune: done in ")
    # an interrupted run says where it stopped; iteration works as tqdm's does
    out = io.StringIO()
    with progress_bar(total=100, desc="x", file=out) as bar:
        bar.update(15)
    assert out.getvalue().splitlines()[-2].startswith("x: 15% (15/100 it)")
    assert "x: ended in" in out.getvalue()
    out = io.StringIO()
    assert list(progress_bar(range(5), desc="it", file=out)) == [0, 1, 2, 3, 4]
    assert "it: done in" in out.getvalue()


def test_a_terminal_gets_tqdm():
    from tqdm import tqdm

    bar = progress_bar(total=3, file=_Tty())
    assert isinstance(bar, tqdm)
    bar.close()


class _Clock:
    """rapt.progress's ``time`` with a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_the_rate_leaves_out_a_slow_first_step_and_says_the_time_left(monkeypatch):
    """Old behaviour: a bar whose first step took a minute (loading, warm-up) and the others
    a second each. Before: "0.0328 step/s" at 20 % (the first step in every rate), no time
    left; now the rate from the first update on, and the time it implies."""
    import rapt.progress

    clock = _Clock()
    monkeypatch.setattr(rapt.progress, "time", clock)
    out = io.StringIO()
    bar = progress_bar(total=10, desc="fit", unit="step", file=out)
    clock.now = 60.0
    bar.update(1)
    for _ in range(9):
        clock.now += 1.0
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "fit: 10% (1/10 steps), 0.0167 step/s, 9.0 min left"
    assert lines[1] == "fit: 20% (2/10 steps), 1 step/s, 8.0 s left"
    assert lines[9] == "fit: 100% (10/10 steps), 1 step/s" and lines[10] == "fit: done in 69.0 s"


def test_units_are_counted_in_the_plural():
    """Old behaviour: "(256/1,600 row)" was printed."""
    out = io.StringIO()
    with progress_bar(total=1600, desc="privatize", unit="row", file=out) as bar:
        bar.update(256)
    assert out.getvalue().startswith("privatize: 16% (256/1,600 rows), ")
    from rapt.numfmt import count

    assert (count(1, "row"), count(2, "token"), count(3, "it")) == ("1 row", "2 tokens", "3 it")


def test_timed_shows_the_clock_of_a_step_without_a_count():
    """Old behaviour: a scikit-learn fit reports no count; its step still shows a clock,
    in a log one line as it starts and one with its time, on a terminal a ticking tqdm line."""
    from rapt.progress import timed

    out = io.StringIO()
    with timed("local model", file=out):
        pass
    assert out.getvalue().splitlines()[0] == "local model: ..."
    assert out.getvalue().splitlines()[1].startswith("local model: done in ")
    tty = _Tty()
    with timed("local model", file=tty, refresh_s=0.01):
        import time

        time.sleep(0.05)
    assert "local model: 00:00" in tty.getvalue()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, toy_backbone):
    tmp = tmp_path_factory.mktemp("progress")
    bb = toy_backbone
    data = tmp / "d.csv"
    data.write_text("text,label\n" + "good film,pos\nbad film,neg\n" * 6)
    return tmp, str(bb), data


def test_tune_log_shows_task_loss_and_l_rec_apart_without_carriage_returns(tiny):
    """Before: one 'loss=359.5' (task + L_rec summed over m positions) in a tqdm line redrawn
    with \\r into the log."""
    tmp, bb, data = tiny
    r = CliRunner().invoke(app, ["tune", str(data), "--out", str(tmp / "a"), "--backbone", bb,
                                 "--epochs", "2", "--batch-size", "4", "--num-virtual-tokens",
                                 "2", "--reconstruction", "--plain-len", "4"])
    assert r.exit_code == 0, r.output
    assert "\r" not in r.output
    steps = [x for x in r.stderr.splitlines() if x.startswith("tune: ") and "% (" in x]
    assert steps and all(" task=" in x and " L_rec=" in x for x in steps), r.stderr
    assert "tune: done in" in r.stderr


def _result(seeds: int, rec_curve: bool = True):
    from rapt.demo import DemoResult, verdict_line

    acc = [0.8 + 0.01 * i for i in range(seeds)]
    rows = [{"setting": s, "accuracy": sum(acc) / seeds, "ci95": 0.0 if seeds == 1 else 0.02,
             "accuracies": acc, "loss_curve": [300.0, 10.0], "task_curve": [0.7, 0.5],
             **({"rec_curve": [299.3, 9.5]} if rec_curve and s == "+reconstruction" else {})}
            for s in ("no privacy", "head only", "+privatization", "+reconstruction")]
    d = {"mean_diff": 0.01, "ci95": 0.0 if seeds == 1 else 0.02, "n": seeds,
         "excludes_zero": False}
    res = DemoResult(config={"method": "prefix", "backbone": "minilm", "train_size": 8,
                             "dataset": "sst2", "plain_len": 4, "seeds": seeds}, eta=70.0,
                     p=0.6, inversion_privacy=0.6, rows=rows, paired=d)
    res.verdict = verdict_line(d, 0.6, 0.6)
    return res


def test_demo_with_one_seed_prints_no_interval():
    from rapt.demo import format_table

    one = format_table(_result(1))
    assert "±" not in one and "95 % CI" not in one and "1 seed, no CI" in one
    assert "1 seed: no CI" in one
    three = format_table(_result(3))
    assert "mean ± 95 % CI" in three and "81.0 % ± 2.0" in three and "(95 % CI, 3 paired" in three


def test_demo_plot_puts_l_rec_on_its_own_axis():
    from rapt.demo import make_plot

    fig = make_plot(_result(3))
    task_ax, rec_ax = fig.axes[1], fig.axes[2]
    assert task_ax.get_ylabel().startswith("task loss")
    assert max(max(line.get_ydata()) for line in task_ax.get_lines()) < 1.0
    assert rec_ax.get_ylabel().startswith("L_rec")
    assert len(make_plot(_result(3, rec_curve=False)).axes) == 2
    json.dumps(_result(1).as_dict())  # the new curves stay JSON
