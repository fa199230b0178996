"""Attacks that measure empirical privacy (= 1 − attack success rate).

Reconstruction attackers register themselves in :data:`rapt.attacks.recovery.ATTACKERS` when
their module is imported; the imports below register this package's attackers (see
:mod:`rapt.attacks.recovery` for the interface). The contextual denoiser is a channel model that
trains through the training loop, so it registers ``"denoiser"`` where it is imported
(:mod:`rapt.channel.denoiser`) and this package stays light.
"""

from rapt.attacks import bayes as _bayes  # noqa: F401  (registers "bayes")
from rapt.attacks import bayes_bigram as _bayes_bigram  # noqa: F401  (registers "bayes-bigram")
from rapt.attacks import llm_recovery as _llm_recovery  # noqa: F401  (registers "llm")
from rapt.attacks.recovery import (
    ATTACKERS,
    Attacker,
    ReconstructionInput,
    register_attacker,
    run_attackers,
    token_recovery,
)

__all__ = ["ATTACKERS", "Attacker", "ReconstructionInput", "register_attacker", "run_attackers",
           "token_recovery"]
