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

from importlib import import_module

# Where each name lives; loaded on first use, so that importing rapt.local.fusion or .denoise
# (a GPU worker, the service) does not import scikit-learn.
_WHERE = {"LocalBaseline": "baseline", "Fusion": "fusion", "fit_user_side": "fusion",
          "holdout_split": "fusion", "Comparison": "verdict", "verdict": "verdict"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'rapt.local' has no attribute {name!r}")
    return getattr(import_module(f"rapt.local.{_WHERE[name]}"), name)
