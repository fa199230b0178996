"""`rapt demo` end to end on a tiny setting (a small random BERT over MiniLM's tokenizer)."""

from __future__ import annotations

import json

import pytest
import torch


@pytest.fixture(scope="module")
def small_bert():
    from transformers import AutoTokenizer, BertConfig, BertModel

    from rapt.models import BackboneNotFoundError, from_model, resolve

    try:
        path, _, _ = resolve("minilm")
    except BackboneNotFoundError as e:
        pytest.skip(str(e))
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    return from_model(BertModel(cfg).eval(), tok, name="small-bert", kind="encoder")


def test_run_demo_tiny(small_bert, shared_data, monkeypatch):
    from rapt.demo import DemoConfig, format_table, make_plot, run_demo

    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    cfg = DemoConfig(train_size=48, test_size=24, max_length=24, plain_len=4, epochs=1,
                     batch_size=16, target_p=0.5, privatizer_mode="exact")
    steps: list[tuple[str, dict]] = []
    res = run_demo(cfg, log=lambda s: None, progress=lambda s, r: steps.append((s, r)),
                   backbone=small_bert)
    assert [r["setting"] for r in res.rows] == ["no privacy", "+privatization",
                                                "+reconstruction"]
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["steps"] == 3 for r in res.rows)
    assert abs(res.p - 0.5) < 0.15 and res.eta > 0  # η calibrated for P = 0.5
    # the inversion attack recovers exactly the unreplaced tokens (same embedding matrix)
    assert abs(res.inversion_privacy - res.p) < 0.15
    assert {s for s, _ in steps} == {"no privacy", "+privatization", "+reconstruction"}
    assert "rec_acc_end" in res.rows[2]
    table = format_table(res)
    assert "+reconstruction" in table and "| P |" not in table.splitlines()[2]
    make_plot(res)
    json.dumps(res.as_dict())


@pytest.mark.integration
def test_demo_cli_minilm(tmp_path, shared_data, monkeypatch):
    from typer.testing import CliRunner

    from rapt.cli import app

    monkeypatch.setenv("RAPT_DATA_DIR", str(shared_data))
    out = tmp_path / "demo"
    r = CliRunner().invoke(app, ["demo", "--out", str(out), "--train-size", "32",
                                 "--test-size", "16", "--epochs", "1", "--max-length", "24",
                                 "--plain-len", "4", "--eta", "60"])
    assert r.exit_code == 0, r.output
    assert "+reconstruction" in r.output
    for f in ("results.json", "results.md", "demo.png"):
        assert (out / f).is_file()
