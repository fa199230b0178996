"""Attacks that measure empirical privacy (= 1 − attack success rate).

Reconstruction attackers register themselves in :data:`rapt.attacks.recovery.ATTACKERS` when
their module is imported; the imports below make that registry complete (see
:mod:`rapt.attacks.recovery` for the interface).
"""

from rapt.attacks import bayes as _bayes  # noqa: F401  (registers "bayes")
from rapt.attacks import denoiser as _denoiser  # noqa: F401  (registers "denoiser")
from rapt.attacks import llm_recovery as _llm_recovery  # noqa: F401  (registers "llm")
from rapt.attacks.inversion import InversionResult, inversion_attack, invert_ids, invert_vectors
from rapt.attacks.recovery import (
    ATTACKERS,
    Attacker,
    ReconstructionInput,
    register_attacker,
    run_attackers,
    token_recovery,
)

__all__ = ["ATTACKERS", "Attacker", "InversionResult", "ReconstructionInput", "inversion_attack",
           "invert_ids", "invert_vectors", "register_attacker", "run_attackers",
           "token_recovery"]
