"""`rapt` command line: thin layers over the Python API, one module per command group."""

from rapt.cli import adapt_cmd as _adapt_cmd  # noqa: E402,F401  (adapt)
from rapt.cli import data_cmd as _data_cmd  # noqa: E402,F401  (data check)
from rapt.cli import pate_cmd as _pate_cmd  # noqa: E402,F401  (pate, mia)

# Importing a module registers its commands on `app`.
from rapt.cli import privatize_cmd as _privatize_cmd  # noqa: E402,F401  (privatize, attack invert)
from rapt.cli import sap_cmd as _sap_cmd  # noqa: E402,F401  (sap tune, predict, attack)
from rapt.cli import serve_cmd as _serve_cmd  # noqa: E402,F401  (serve, client)
from rapt.cli import tune_cmd as _tune_cmd  # noqa: E402,F401  (tune, predict, demo, attack attribute)
from rapt.cli._app import app


def main() -> None:
    app()
