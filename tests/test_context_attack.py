"""The contextual guess from released neighbours (rapt.attacks.context)."""

from __future__ import annotations

import random

import pytest

from rapt.attacks.context import ContextGuesser


def _pairs(n: int = 2000, seed: int = 0):
    """Rows [a, x, b] whose middle original x is fixed by (a, b) = x // 10, x % 10 and
    released as a random id: nothing of x is in its own position's release."""
    rng = random.Random(seed)
    clean, released = [], []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        x = 100 + 10 * a + b
        clean.append([a, x, b])
        released.append([a, rng.randrange(1000, 2000), b])
    return clean, released


def test_the_middle_token_comes_back_from_its_neighbours_alone():
    clean, released = _pairs()
    g = ContextGuesser.fit(clean, released)
    test_clean, test_released = _pairs(50, seed=1)
    guesses = g.guess(test_released)
    assert [r[1] for r in guesses] == [r[1] for r in test_clean]
    # A one-token row's neighbours are both the row's edges.
    edge = ContextGuesser.fit([[7], [1, 2]], [[3], [1, 2]])
    assert edge.both[(-1, -1)] == 7 and edge.guess([[9]]) == [[7]]


def test_it_backs_off_to_the_left_then_the_right_then_the_most_frequent_token():
    clean = [[1, 7, 2], [1, 7, 3], [4, 8, 5], [9, 8, 6], [0, 8, 0]]
    released = [[1, 50, 2], [1, 51, 3], [4, 52, 5], [9, 53, 6], [0, 54, 0]]
    g = ContextGuesser.fit(clean, released)
    got = g.guess([[1, 99, 5], [77, 99, 6], [77, 99, 78]])
    assert [r[1] for r in got] == [7, 8, 8]  # left "1"; right "6"; 8 is the commonest middle
    assert g.default == 8


def test_ties_go_to_the_smallest_id_and_misaligned_rows_are_refused():
    g = ContextGuesser.fit([[5, 3], [5, 2]], [[5, 9], [5, 9]])
    assert g.guess([[5, 9]])[0][1] == 2
    with pytest.raises(ValueError, match="row 0: 2 clean tokens for 1 released"):
        ContextGuesser.fit([[1, 2]], [[1]])
    with pytest.raises(ValueError, match="1 clean rows for 2 released"):
        ContextGuesser.fit([[1]], [[1], [2]])
