"""The frozen-feature probe's statistics: paired differences and the replaced share."""

import numpy as np

from benchmarks.bench_frozen_probe import paired_diff, replaced_share, summarize


def test_paired_difference_and_its_bootstrap_interval():
    a = [[1, 1, 0, 1] * 25, [1, 0, 1, 1] * 25]  # 75 % right in both seeds
    b = [[1, 0, 0, 1] * 25, [0, 0, 1, 1] * 25]  # 50 %
    d = paired_diff(a, b)
    assert d["diff"] == 0.25 and d["per_seed"] == [0.25, 0.25]
    assert d["ci95"][0] < 0.25 < d["ci95"][1] and d["ci95"][0] > 0.1
    same = paired_diff(a, a)
    assert same["diff"] == 0 and same["ci95"] == [0.0, 0.0]  # paired: no spread at all


def test_replaced_share_skips_special_tokens():
    assert replaced_share([[0, 5, 6, 2], [0, 7, 2]], [[0, 9, 6, 2], [0, 7, 2]], {0, 2}) == (1, 3)


def test_summary_pairs_cells_by_seed():
    def cell(mech, seed, right):
        return {"task": "t", "seed": seed, "mechanism": mech, "accuracy": float(np.mean(right)),
                "right": right, "p_all_tokens": 0.5, "n_train": 4, "n_eval": len(right)}

    cells = [cell("uniform", 1, [0, 0, 1, 1]), cell("rare", 1, [1, 1, 1, 1]),
             cell("uniform", 0, [0, 1, 1, 1]), cell("rare", 0, [0, 1, 1, 1])]
    row = summarize({"bb": {"cells": cells}}, [0, 1])[0]
    assert row["accuracy"] == {"uniform": 0.625, "rare": 0.875}
    assert row["diff_vs_uniform"]["rare"]["per_seed"] == [0.0, 0.5]
