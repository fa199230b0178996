"""PromptDPSGD: DP-SGD on the soft prompt / prefix only (Duan et al. 2023, Alg. 1).

``DPConfig`` holds the settings, ``DPSGD`` clips per-example gradients and adds noise inside
the trainer's loop, and the accounting helpers wrap opacus' RDP / PRV accountants.

What the guarantee covers: (ε, δ)-DP (add/remove one example) for *everything trained*, i.e.
every parameter with ``requires_grad`` in the model handed to ``DPSGD``: the prompt or prefix,
a prefix projection MLP, the task head and, with RAPT, the reconstruction head. They are clipped
jointly (one norm per example over all of them) and noised together, so releasing any of them is
post-processing. The frozen backbone and the public plain tokens carry no private information.
Sampling and noise come from OS entropy unless a seed is given; a known seed voids the guarantee.
"""

from rapt.dp.accounting import epsilon, find_noise_multiplier, make_accountant, steps_for_epochs
from rapt.dp.config import DPConfig, dp_config_from_options
from rapt.dp.engine import DPSGD
from rapt.dp.sampling import micro_batches, poisson_batch, poisson_batches

__all__ = [
    "DPConfig", "DPSGD", "dp_config_from_options", "epsilon", "find_noise_multiplier",
    "make_accountant", "steps_for_epochs", "poisson_batch", "poisson_batches", "micro_batches",
]
