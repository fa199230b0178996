"""The user's side: what the user computes alone on its clean text, at no privacy cost.

Nothing here leaves the user's machine: the local model, its weights, its cross-validated
accuracy and the fusion weights are statistics of private rows. They are saved beside a
shareable output, never inside it, and never sent to a provider.

- :class:`LocalBaseline` (``baseline.py``): TF-IDF + logistic regression on the clean rows,
  C chosen by cross-validation. The model a privatized customization has to beat.
- :class:`Fusion` (``fusion.py``): the remote probabilities (privatized query) and the local ones
  (clean query) in one weighted log-linear pool, its two weights fitted on rows the remote
  prompt never trained on (:func:`holdout_split`).
- :func:`verdict` (``verdict.py``): the plain sentence that says which one to use.
"""

from rapt.local.fusion import Fusion, fit_user_side, holdout_split
from rapt.local.verdict import Comparison, verdict

__all__ = ["Comparison", "Fusion", "LocalBaseline", "fit_user_side", "holdout_split", "verdict"]


def __getattr__(name: str):
    # LocalBaseline is loaded on first use: importing rapt.local.fusion or .denoise (a GPU
    # worker, the service, `rapt predict --no-local`) does not import scikit-learn.
    if name == "LocalBaseline":
        from rapt.local.baseline import LocalBaseline

        return LocalBaseline
    raise AttributeError(f"module 'rapt.local' has no attribute {name!r}")
