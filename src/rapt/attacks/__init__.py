"""Attacks that measure empirical privacy (= 1 − attack success rate)."""

from rapt.attacks.inversion import InversionResult, inversion_attack, invert_ids, invert_vectors

__all__ = ["InversionResult", "inversion_attack", "invert_ids", "invert_vectors"]
