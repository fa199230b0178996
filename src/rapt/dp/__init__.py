"""PromptDPSGD: DP-SGD on the soft prompt / prefix only (Duan et al. 2023, Alg. 1).

``DPConfig`` holds the settings, ``DPSGD`` clips per-example gradients and adds noise inside
the trainer's loop, and the accounting helpers wrap opacus' RDP / PRV accountants.
"""

from rapt.dp.accounting import epsilon, find_noise_multiplier, make_accountant, steps_for_epochs
from rapt.dp.config import DPConfig
from rapt.dp.engine import DPSGD
from rapt.dp.sampling import micro_batches, poisson_batch, poisson_batches

__all__ = [
    "DPConfig", "DPSGD", "epsilon", "find_noise_multiplier", "make_accountant",
    "steps_for_epochs", "poisson_batch", "poisson_batches", "micro_batches",
]
