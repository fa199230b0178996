"""The customization pipeline, one layer above the methods: what the commands, the demo, the
client and the service's worker assemble.

- ``customization.py``: :class:`Customization` (backbone + privatizer + :class:`Encoding` +
  tuner config + channel model → artifact and privacy report) and :func:`make_privatizer`.
- ``user_side.py``: after a remote tune, on the user's clean rows: the held-out comparison, the
  local model and the fusion (:func:`user_side_after_tune`), and the output denoiser
  (:func:`fit_output_denoiser`, :func:`denoised_proba`).
"""

from rapt.pipeline.customization import (
    CHANNEL_NOTE,
    COLLAPSE_CHECK_ROWS,
    PRIVATIZE_CHUNK,
    Customization,
    Encoding,
    make_privatizer,
    plain_tokens_for,
)
from rapt.pipeline.user_side import (
    denoised_proba,
    fit_output_denoiser,
    output_denoiser_corpus,
    remote_proba,
    user_side_after_tune,
)

__all__ = ["CHANNEL_NOTE", "COLLAPSE_CHECK_ROWS", "PRIVATIZE_CHUNK", "Customization", "Encoding",
           "denoised_proba", "fit_output_denoiser", "make_privatizer", "output_denoiser_corpus",
           "plain_tokens_for", "remote_proba", "user_side_after_tune"]
