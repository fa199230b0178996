"""The by-kind settings of the local-baseline grid: each name builds the policy it says."""

from benchmarks.local_baseline import LABELS, MECHS, kind_policy
from benchmarks.local_baseline_by_kind import LABEL, SETTINGS

ETAS = {"0.2": 90.0, "0.6": 60.0, "0.7": 55.0}


def test_every_setting_builds_its_policy_and_has_a_label():
    for name, (protect, strong, other, personal, *rank) in MECHS.items():
        eta, policy = kind_policy(name, ETAS)
        assert eta == ETAS[str(strong)] and policy.protect == protect
        assert policy.eta_other == (None if other is None else ETAS[str(other)])
        assert policy.eta_personal == personal
        assert policy.personal_rank == (rank[0] if rank else None)
        policy.check_against(eta)
    assert set(LABELS) == set(MECHS) and set(LABEL) == set(SETTINGS)


def test_personal_data_at_eta_0_is_the_r07_policy_plus_the_swap():
    eta, z = kind_policy("r0.7z", ETAS)
    eta7, r = kind_policy("r0.7", ETAS)
    assert eta == eta7 and z.eta_personal == 0.0 and r.eta_personal is None
    assert z.class_etas(eta) == {**r.class_etas(eta), "personal": 0.0}


def test_a_cell_is_scored_again_when_its_file_or_the_scorer_changes(tmp_path, monkeypatch):
    """The score cache (local_baseline_scored.jsonl) holds a cell's scores only for the file
    and the scorer that made them: a cell run again, or a changed local model, is rescored."""
    import benchmarks.local_baseline_report as report

    cells = tmp_path / "cells"
    cells.mkdir()
    for key in ("sst2_500_0.6_0", "sst2_500_0.6_1"):
        (cells / f"{key}.npz").write_bytes(key.encode())
    calls = []

    def fake_score(path):
        calls.append(path.stem)
        return {"accuracy": {"fused": len(path.read_bytes())}}

    monkeypatch.setattr(report, "score_cell", fake_score)
    monkeypatch.setattr(report, "scorer_fingerprint", lambda: "v1")
    cache = tmp_path / "scored.jsonl"
    report.score_all(cells, cache, lambda p: True)
    assert sorted(calls) == ["sst2_500_0.6_0", "sst2_500_0.6_1"]
    calls.clear()
    assert [d["accuracy"]["fused"] for d in report.score_all(cells, cache, lambda p: True)] \
        == [14, 14] and calls == []
    (cells / "sst2_500_0.6_1.npz").write_bytes(b"run again, longer")
    got = report.score_all(cells, cache, lambda p: True)
    assert calls == ["sst2_500_0.6_1"] and got[1]["accuracy"]["fused"] == 17
    assert len(cache.read_text().splitlines()) == 2  # one line per cell, the newest
    calls.clear()
    monkeypatch.setattr(report, "scorer_fingerprint", lambda: "v2")
    report.score_all(cells, cache, lambda p: True)
    assert sorted(calls) == ["sst2_500_0.6_0", "sst2_500_0.6_1"]


def test_the_scorer_fingerprint_covers_the_local_model():
    import benchmarks.local_baseline_report as report

    assert len(report.scorer_fingerprint()) == 64
    assert report.scorer_fingerprint() == report.scorer_fingerprint()
