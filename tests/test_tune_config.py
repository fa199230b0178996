"""rapt.config.tune_config: the one way the CLI, the demo and the service turn options into a
TuneConfig, with the head's inputs filled in from the data."""

from __future__ import annotations

import pytest

from rapt.config import tune_config
from rapt.data import label_descriptions_for
from rapt.dp.config import DPConfig
from rapt.tuning.tune import resolve_head

NAMES = ["negative", "positive"]


def test_unknown_keys_are_ignored_and_dp_mappings_become_dp_configs():
    cfg = tune_config({"method": "prompt", "epochs": 2, "data": "x.csv", "out": None,
                       "dp": {"noise_multiplier": 1.0, "delta": None}})
    assert (cfg.method, cfg.epochs) == ("prompt", 2)
    assert isinstance(cfg.dp, DPConfig) and cfg.dp.noise_multiplier == 1.0
    assert tune_config({"dp": {}}).dp is None and tune_config({"dp": None}).dp is None
    dp = DPConfig(noise_multiplier=2.0)
    assert tune_config({"dp": dp}).dp is dp


def test_an_encoder_reads_the_built_in_descriptions_and_a_causal_lm_the_label_names():
    assert label_descriptions_for("sst2")  # the case below needs a built-in with them
    enc = tune_config({}, kind="encoder", label_names=NAMES, dataset="sst2")
    assert enc.label_descriptions == label_descriptions_for("sst2") and enc.label_words is None
    assert resolve_head("encoder", enc) == "label-description"
    causal = tune_config({}, kind="causal", label_names=NAMES, dataset="sst2")
    assert causal.label_words == NAMES and causal.label_descriptions is None
    assert resolve_head("causal", causal) == "verbalizer"
    given = tune_config({"label_descriptions": ["bad", "good"], "label_words": ["no", "yes"]},
                        kind="causal", label_names=NAMES, dataset="sst2")
    assert (given.label_descriptions, given.label_words) == (["bad", "good"], ["no", "yes"])
    plain = tune_config({}, kind="encoder", label_names=NAMES, dataset="my.csv")
    assert resolve_head("encoder", plain) == "linear"
    assert tune_config({}).label_descriptions is None  # no label names: nothing filled in


def test_a_head_without_its_inputs_or_with_too_few_descriptions_is_refused():
    with pytest.raises(ValueError, match="my.csv has no built-in label descriptions.*"
                                         "negative=...|positive=..."):
        tune_config({"head": "label-description"}, kind="encoder", label_names=NAMES,
                    dataset="my.csv")
    with pytest.raises(ValueError, match=r"label_descriptions: 1 given for 2 labels"):
        tune_config({"label_descriptions": ["only one"]}, kind="encoder", label_names=NAMES)


@pytest.mark.parametrize("n,batch,epochs", [(10, 4, 3), (8, 4, 2), (1, 32, 1)])
def test_every_caller_counts_the_steps_of_a_run_the_same_way(n, batch, epochs):
    from rapt.service.worker import planned_steps as job_steps
    from rapt.split import SplitConfig, total_steps
    from rapt.training.loop import MeanStep, Plan
    from rapt.tuning.tune import planned_steps

    want = -(-n // batch) * epochs  # batches per epoch, the last one short
    assert Plan.of_batches(n, batch, epochs).total_steps == want
    assert MeanStep(None, n, batch, epochs, 0).plan.total_steps == want
    assert total_steps(n, SplitConfig(batch_size=batch, epochs=epochs)) == want
    assert planned_steps(tune_config({"batch_size": batch, "epochs": epochs}), n) == want
    assert job_steps({"batch_size": batch, "epochs": epochs}, n) == want


def test_a_dp_batch_larger_than_the_data_is_refused_with_the_fix():
    from rapt.tuning.tune import planned_steps

    with pytest.raises(ValueError, match="batch_size=8 is larger than the dataset.*dp.sample_rate"):
        planned_steps(tune_config({"batch_size": 8, "dp": {"noise_multiplier": 1.0}}), 4)
    assert planned_steps(tune_config({"batch_size": 2, "epochs": 1,
                                      "dp": {"noise_multiplier": 1.0}}), 4) == 2
