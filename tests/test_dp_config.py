"""DPConfig refuses impossible settings with a message naming the field."""

from __future__ import annotations

import math

import pytest

from rapt.dp import DPConfig


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"target_epsilon": 0.0}, "target_epsilon"),
    ({"target_epsilon": -1.0}, "target_epsilon"),
    ({"target_epsilon": math.nan}, "target_epsilon"),
    ({"target_epsilon": math.inf}, "dp=None"),
    ({"target_epsilon": 8.0, "noise_multiplier": 1.0}, "not both"),
    ({}, "one of target_epsilon or noise_multiplier"),
    ({"noise_multiplier": -0.5}, "noise_multiplier"),
    ({"noise_multiplier": 1.0, "sample_rate": 0.0}, r"sample_rate.*\(0, 1\]"),
    ({"noise_multiplier": 1.0, "sample_rate": 1.2}, r"sample_rate.*\(0, 1\]"),
    ({"noise_multiplier": 1.0, "max_grad_norm": 0.0}, "max_grad_norm"),
    ({"noise_multiplier": 1.0, "max_grad_norm": -1.0}, "max_grad_norm"),
    ({"noise_multiplier": 1.0, "delta": 0.0}, "delta"),
    ({"noise_multiplier": 1.0, "delta": 1.0}, "delta"),
    ({"noise_multiplier": 1.0, "physical_batch_size": 0}, "physical_batch_size"),
    ({"noise_multiplier": 1.0, "accountant": "moments"}, "accountant"),
])
def test_invalid_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DPConfig(**kwargs)


def test_resolution():
    cfg = DPConfig(target_epsilon=8.0)
    assert cfg.resolve_delta(1000) == pytest.approx(1e-3)
    assert cfg.resolve_sample_rate(1000, batch_size=100) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="sample_rate is not set"):
        cfg.resolve_sample_rate(1000)
    with pytest.raises(ValueError, match="non-empty"):
        cfg.resolve_delta(0)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        cfg.resolve_sample_rate(10, batch_size=11)
    assert DPConfig(noise_multiplier=1.0, sample_rate=0.3).resolve_sample_rate(10) == 0.3


def test_cli_options():
    from rapt.dp import dp_config_from_options

    assert dp_config_from_options() is None
    cfg = dp_config_from_options(epsilon=8, clip=0.1, physical_batch=16)
    assert (cfg.target_epsilon, cfg.max_grad_norm, cfg.physical_batch_size) == (8, 0.1, 16)
    assert dp_config_from_options(noise=1.2).noise_multiplier == 1.2
    for kwargs, flag in [({"epsilon": 0.0}, "--dp-epsilon"), ({"epsilon": -3.0}, "--dp-epsilon"),
                         ({"epsilon": math.inf}, "--dp-epsilon"), ({"noise": -1.0}, "--dp-noise"),
                         ({"epsilon": 8, "clip": 0.0}, "--dp-clip"),
                         ({"epsilon": 8, "delta": 2.0}, "--dp-delta"),
                         ({"epsilon": 8, "sample_rate": 0.0}, "--dp-sample-rate"),
                         ({"epsilon": 8, "physical_batch": 0}, "--dp-physical-batch"),
                         ({"clip": 1.0}, "--dp-clip"), ({"epsilon": 8, "noise": 1}, "not both")]:
        with pytest.raises(ValueError, match=flag):
            dp_config_from_options(**kwargs)
