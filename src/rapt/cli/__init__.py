"""`rapt` command line: thin layers over the Python API, one module per command group."""

# Importing a module registers its commands on `app`, in this order: the order of `rapt --help`
# (commands first, then groups, each in the order registered).
# isort: off
from rapt.cli import adapt_cmd as _adapt_cmd  # noqa: F401  (adapt)
from rapt.cli import pate_cmd as _pate_cmd  # noqa: F401  (pate, mia)
from rapt.cli import privatize_cmd as _privatize_cmd  # noqa: F401  (privatize)
from rapt.cli import tune_cmd as _tune_cmd  # noqa: F401  (tune)
from rapt.cli import predict_cmd as _predict_cmd  # noqa: F401  (predict)
from rapt.cli import demo_cmd as _demo_cmd  # noqa: F401  (demo)
from rapt.cli import data_cmd as _data_cmd  # noqa: F401  (data check, data cti)
from rapt.cli import attack_cmd as _attack_cmd  # noqa: F401  (attack invert, reconstruct, attribute)
from rapt.cli import sap_cmd as _sap_cmd  # noqa: F401  (sap tune, predict, attack)
from rapt.cli import serve_cmd as _serve_cmd  # noqa: F401  (serve)
from rapt.cli import keys_cmd as _keys_cmd  # noqa: F401  (serve keys)
from rapt.cli import client_cmd as _client_cmd  # noqa: F401  (client)
# isort: on
from rapt.cli._app import app


def main() -> None:
    app()
