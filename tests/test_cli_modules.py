"""The CLI's layout: one module per command group, each command's options one frozen dataclass
with a field per parameter (what its stage helpers receive), and `rapt --help` listing the
commands in the order the modules register them."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from typer.testing import CliRunner

from rapt.cli import app
from rapt.cli.adapt_cmd import AdaptOptions, adapt
from rapt.cli.demo_cmd import DemoOptions, demo
from rapt.cli.predict_cmd import PredictOptions, predict
from rapt.cli.tune_cmd import TuneOptions, tune


@pytest.mark.parametrize("command, options", [(tune, TuneOptions), (predict, PredictOptions),
                                              (demo, DemoOptions), (adapt, AdaptOptions)])
def test_options_are_the_commands_parameters_frozen(command, options):
    params = inspect.signature(command).parameters
    assert [f.name for f in dataclasses.fields(options)] == list(params)
    o = options(**{name: p.default.default for name, p in params.items()})
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.out = None


def _commands(args: list[str]) -> list[str]:
    r = CliRunner().invoke(app, [*args, "--help"])
    assert r.exit_code == 0, r.output
    listed = r.output.split("Commands:")[1].splitlines()
    return [line.split()[0] for line in listed if line.startswith("  ") and line[2] != " "]


def test_help_lists_the_commands_in_their_order():
    assert _commands([]) == ["version", "adapt", "pate", "mia", "privatize", "tune", "predict",
                             "demo", "data", "attack", "sap", "serve", "client"]
    assert _commands(["attack"]) == ["invert", "reconstruct", "attribute"]
    assert _commands(["serve"]) == ["keys"]
    assert _commands(["serve", "keys"]) == ["add", "list", "revoke", "purge"]
    assert _commands(["client"]) == ["upload", "tune", "local", "status", "predict"]
