"""Attacks that measure empirical privacy (= 1 − attack success rate)."""

from rapt.attacks.inversion import InversionResult, invert_ids, invert_vectors, inversion_attack

__all__ = ["InversionResult", "inversion_attack", "invert_ids", "invert_vectors"]
