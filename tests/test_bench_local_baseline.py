"""The by-kind settings of the local-baseline grid: each name builds the policy it says."""

from benchmarks.local_baseline import LABELS, MECHS, kind_policy
from benchmarks.local_baseline_by_kind import LABEL, SETTINGS

ETAS = {"0.2": 90.0, "0.6": 60.0, "0.7": 55.0}


def test_every_setting_builds_its_policy_and_has_a_label():
    for name, (protect, strong, other, personal) in MECHS.items():
        eta, policy = kind_policy(name, ETAS)
        assert eta == ETAS[str(strong)] and policy.protect == protect
        assert policy.eta_other == (None if other is None else ETAS[str(other)])
        assert policy.eta_personal == personal
        policy.check_against(eta)
    assert set(LABELS) == set(MECHS) and set(LABEL) == set(SETTINGS)


def test_personal_data_at_eta_0_is_the_r07_policy_plus_the_swap():
    eta, z = kind_policy("r0.7z", ETAS)
    eta7, r = kind_policy("r0.7", ETAS)
    assert eta == eta7 and z.eta_personal == 0.0 and r.eta_personal is None
    assert z.class_etas(eta) == {**r.class_etas(eta), "personal": 0.0}
