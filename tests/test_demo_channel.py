"""`rapt demo --channel`: the +denoise-then-tune row (the +privatization rows and queries read
back by a channel model through Customization), its verdict line on the privatization gap won
back, and the one-line pointer to `rapt adapt` without a channel (issue 27 item 5)."""

from __future__ import annotations

import json

import pytest

CFG = dict(train_size=24, test_size=12, max_length=16, plain_len=4, epochs=1, batch_size=8,
           target_p=0.5, privatizer_mode="exact", noise_seed=0)


def test_demo_channel_row_and_verdict(small_bert, shared_data, monkeypatch):
    from rapt.channel.denoiser import Denoiser, DenoiserConfig
    from rapt.channel.model import channel_fingerprint
    from rapt.data import load_dataset
    from rapt.demo import (
        CHANNEL_SETTING,
        LOCAL_SETTINGS,
        NO_CHANNEL_LINE,
        DemoConfig,
        format_table,
        make_plot,
        run_demo,
    )
    from rapt.pipeline import Encoding

    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    # Untrained and without the keep bonus: it replaces most tokens, so its row differs.
    den = Denoiser(small_bert, DenoiserConfig(max_length=32, keep_bonus=0.0, seed=1))
    seen: list[list[int]] = []
    inner = den.denoise
    den.denoise = lambda rows, *a, **k: seen.extend(map(list, rows)) or inner(rows, *a, **k)
    logs: list[str] = []
    res = run_demo(DemoConfig(**CFG, seeds=2), log=logs.append, backbone=small_bert,
                   channel=den)
    assert [r["setting"] for r in res.rows] == ["no privacy", "head only", "+privatization",
                                                "+reconstruction", CHANNEL_SETTING,
                                                *LOCAL_SETTINGS]
    chan, priv, clean = (res.rows[i]["accuracies"] for i in (4, 2, 0))
    won = res.channel["won_back"]
    assert won["diff"]["n"] == 2
    assert won["diff"]["mean_diff"] == pytest.approx((chan[0] - priv[0] + chan[1] - priv[1]) / 2)
    assert won["gap"]["mean_diff"] == pytest.approx((clean[0] - priv[0] + clean[1] - priv[1]) / 2)
    if won["gap"]["mean_diff"] > 0:
        assert won["share"] == pytest.approx(won["diff"]["mean_diff"] / won["gap"]["mean_diff"])
        assert f"wins back {won['share']:.0%} of the privatization gap" in res.channel_verdict
    else:  # what this tiny random model gives: no gap, and the line says so
        assert won["share"] != won["share"] and "no privatization gap" in res.channel_verdict
    assert res.channel_verdict.startswith("denoise-then-tune ") and "2 paired seeds" in \
        res.channel_verdict
    assert res.channel["fingerprint"] == channel_fingerprint(den)
    ch = res.channel["privacy"]
    assert 0.0 <= ch["recovery"] <= 1.0 and ch["empirical_privacy"] == pytest.approx(
        1 - max(ch["recovery"], res.inversion_success))
    assert res.channel_verdict in logs and NO_CHANNEL_LINE not in logs
    assert any("the channel model, as an attacker, recovers" in s for s in logs)

    # It read privatized text positions only: per seed the training rows and the test queries
    # (and the first seed's queries once more, scored as an attacker), never the clean rows.
    tok = small_bert.tokenizer
    train = load_dataset("sst2-sentences", "train").subset(24, seed=0).texts
    test = load_dataset("sst2-sentences", "dev").subset(12, seed=0).texts
    clean_rows = [r[1:-1] for r in Encoding(16).rows(tok, test + train)]  # [CLS] x [SEP]
    assert len(seen) == 12 + 2 * (24 + 12)  # the attack, then per seed tune and predict
    assert [len(r) for r in seen[:36]] == [len(r) for r in clean_rows]  # aligned, privatized
    assert not set(map(tuple, seen)) & set(map(tuple, (r for r in clean_rows if len(r) > 3)))
    assert not any(set(r) & set(tok.all_special_ids) for r in seen)

    table = format_table(res)
    assert f"| {CHANNEL_SETTING} |" in table and res.channel_verdict in table
    assert "an upper bound on privacy), set by" in table
    make_plot(res)
    json.dumps(res.as_dict())


def test_demo_without_channel_points_to_adapt(small_bert, shared_data, monkeypatch,
                                              tmp_path):
    from rapt.demo import LOCAL_SETTINGS, NO_CHANNEL_LINE, SETTINGS, DemoConfig, run_demo

    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    logs: list[str] = []
    res = run_demo(DemoConfig(**CFG, seeds=1), log=logs.append, backbone=small_bert)
    assert [r["setting"] for r in res.rows] == [*SETTINGS, *LOCAL_SETTINGS]
    assert res.channel == {}
    assert logs.count(NO_CHANNEL_LINE) == 1 and "rapt adapt" in NO_CHANNEL_LINE
    assert "--channel" in NO_CHANNEL_LINE
    with pytest.raises(ValueError, match=f"channel {tmp_path}"):
        run_demo(DemoConfig(**CFG, seeds=1, channel=str(tmp_path)), log=logs.append,
                 backbone=small_bert)


def test_demo_cli_channel_option_reaches_the_config(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import rapt.demo
    from rapt.cli import app

    seen = {}

    def fake_run(cfg, **kw):
        seen["cfg"] = cfg
        raise ValueError("stop here")

    monkeypatch.setattr(rapt.demo, "run_demo", fake_run)
    r = CliRunner().invoke(app, ["demo", "--paper", "--out", str(tmp_path / "d"), "--channel",
                                 str(tmp_path / "ch")])
    assert r.exit_code == 2 and "stop here" in r.output
    assert seen["cfg"].channel == str(tmp_path / "ch")


def test_channel_verdict_line_reports_the_share_of_the_gap():
    from rapt.demo import channel_verdict_line
    from rapt.stats import gap_won_back

    won = gap_won_back([0.80, 0.72, 0.70], [0.60, 0.50, 0.52], [1.00, 0.90, 0.92])
    assert won["diff"]["mean_diff"] == pytest.approx(0.20)
    assert won["gap"]["mean_diff"] == pytest.approx(0.40) and won["share"] == pytest.approx(0.5)
    line = channel_verdict_line(won, 0.4, 0.41)
    assert line.startswith("denoise-then-tune helped here: +denoise-then-tune − +privatization "
                           "= +20.0 ± ")
    assert "3 paired seeds, P≈0.4" in line and "wins back 50% of the privatization gap" in line
    assert "(no privacy − +privatization = +40.0 ± " in line
    worse = gap_won_back([0.5, 0.4], [0.6, 0.5], [0.9, 0.8])
    assert worse["share"] == pytest.approx(-1 / 3)
    assert channel_verdict_line(worse, None, 0.41).startswith("denoise-then-tune hurt here")
