"""Fair share (broker/policy/fairshare.py): decay, the Fair Tree factor, and the bank tree's rules; and the
multifactor priority formula (broker/policy/priority.py).  Pure: no sockets, no clock."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.policy.fairshare import FairShare, Usage
from broker.policy.priority import Priority
from broker.sched import Request, SchedJob
from minicluster.model.sharing import Weights

HOUR = 3600.0


def test_usage_halves_over_one_half_life_without_charge() -> None:
    fs = FairShare(half_life=HOUR)
    fs.restore(("root", 1), 1000.0, 0.0)
    fs.compute(HOUR)
    assert fs.usage[("root", 1)].value == pytest.approx(500.0)
    fs.compute(3 * HOUR)
    assert fs.usage[("root", 1)].value == pytest.approx(125.0)


def test_steady_rate_integrates_exactly_and_saturates() -> None:
    """dU/dt = rate - λU: after t, U = rate (1 - e^(-λt)) / λ; it tends to rate / λ."""
    decay = math.log(2) / HOUR
    usage = Usage(0.0, 0.0)
    usage.rate = 4.0
    usage.advance(1800.0, decay)
    assert usage.value == pytest.approx(4.0 * (1 - math.exp(-decay * 1800)) / decay)
    stepwise = Usage(0.0, 0.0)
    stepwise.rate = 4.0
    for t in range(60, 1801, 60):
        stepwise.advance(float(t), decay)
    assert stepwise.value == pytest.approx(usage.value)  # the same whatever the steps
    usage.advance(100 * HOUR, decay)
    assert usage.value == pytest.approx(4.0 / decay, rel=1e-6)


def test_rate_changes_charge_core_seconds_without_decay() -> None:
    fs = FairShare(half_life=0)  # no decay: usage is plain core-seconds
    fs.rate_change(("root", 7), 8.0, 100.0)   # 8 cores from t=100
    fs.rate_change(("root", 7), -8.0, 110.0)  # ... to t=110
    fs.rate_change(("root", 7), 2.0, 120.0)
    fs.compute(125.0)
    assert fs.usage[("root", 7)].value == pytest.approx(8 * 10 + 2 * 5)


def _tree() -> FairShare:
    fs = FairShare(half_life=0)
    fs.set_bank("a", "root", 1)
    fs.set_bank("b", "root", 1)
    for uid in (1, 2):
        fs.set_member("a", uid, 1)
    fs.set_member("b", 3, 1)
    return fs


def test_fair_tree_ranks_users_of_the_bank_under_its_share_first() -> None:
    fs = _tree()
    fs.restore(("a", 1), 900.0, 0.0)   # bank a used 90 %, bank b 10 %: b is under its half
    fs.restore(("b", 3), 100.0, 0.0)
    f = fs.compute(0.0)
    # User 3 (bank b) first; within a, user 2 (no usage) before user 1.
    assert f[("b", 3)] == 1.0
    assert f[("a", 2)] == pytest.approx(2 / 3)
    assert f[("a", 1)] == pytest.approx(1 / 3)
    a = next(n for n in fs.nodes if n.name == "a")
    assert a.level_fs == pytest.approx(0.5 / 0.9)
    assert a.norm_shares == 0.5


def test_all_users_of_a_better_bank_beat_every_user_of_a_worse_one() -> None:
    """Fair Tree's defining property, even when a user of the worse bank has used nothing."""
    fs = _tree()
    fs.set_member("b", 4, 1)
    fs.restore(("a", 1), 100.0, 0.0)
    fs.restore(("a", 2), 100.0, 0.0)
    fs.restore(("b", 3), 5000.0, 0.0)  # bank b is far over its share; user 4 of b never ran
    f = fs.compute(0.0)
    assert min(f[("a", 1)], f[("a", 2)]) > max(f[("b", 3)], f[("b", 4)])


def test_equal_siblings_tie_and_no_shares_means_zero() -> None:
    fs = FairShare(half_life=0)
    for uid in (1, 2):
        fs.set_member("root", uid, 1)
    fs.set_member("root", 3, 0)
    f = fs.compute(0.0)
    assert f[("root", 1)] == f[("root", 2)] == 1.0
    assert f[("root", 3)] == 0.0


def test_users_in_no_bank_are_charged_under_root_with_one_share() -> None:
    fs = _tree()
    assert fs.assoc(99, None) == ("root", 99)
    assert fs.assoc(1, None) == ("a", 1)
    with pytest.raises(ValueError, match="not a member"):
        fs.assoc(1, "b")
    fs.rate_change(("root", 99), 1.0, 0.0)
    fs.compute(10.0)
    node = next(n for n in fs.nodes if n.user == 99)
    assert node.parent == "root" and node.shares == 1


def test_bank_tree_rules() -> None:
    fs = _tree()
    with pytest.raises(ValueError, match="does not exist"):
        fs.set_bank("x", "nosuch", 1)
    with pytest.raises(ValueError, match="under itself"):
        fs.set_bank("c", "root", 1) or fs.set_bank("d", "c", 1) or fs.set_bank("c", "d", 1)
    with pytest.raises(ValueError, match="sub-banks"):
        fs.remove_bank("c")
    fs.remove_bank("d")
    fs.remove_bank("a")
    assert ("a", 1) not in fs.members and fs.banks_of(1) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.floats(0, 1e6)), min_size=1, max_size=12))
def test_factors_are_ranks_in_zero_one(usages: list[tuple[int, float]]) -> None:
    fs = FairShare(half_life=HOUR)
    for i, (shares, used) in enumerate(usages):
        fs.set_member("root", i, shares)
        fs.restore(("root", i), used, 0.0)
    f = fs.compute(0.0)
    assert set(f) == {("root", i) for i in range(len(usages))}
    assert all(0 < v <= 1 for v in f.values()) and max(f.values()) == 1.0
    # A user with a strictly lower usage/shares ratio never ranks below one with a higher ratio.
    ratio = {i: used / shares for i, (shares, used) in enumerate(usages)}
    for i in ratio:
        for j in ratio:
            if ratio[i] < ratio[j] * (1 - 1e-9):
                assert f[("root", i)] >= f[("root", j)]


def _job(**fields: object) -> SchedJob:
    return SchedJob(job_id=1, **fields)  # type: ignore[arg-type]


def test_priority_is_the_weighted_sum_of_factors() -> None:
    w = Weights(fairshare=1000, queue=100, urgency=31, age=50, jobsize=10, max_age=100.0)
    prio = Priority(w, {"low": 0, "high": 10}, total_cores=64)
    job = _job(urgency=31, submit_time=0.0, queue="high", request=Request(nslots=4, cores_per_slot=4))
    parts = prio.components(job, fairshare=0.5, now=50.0)
    assert parts["factors"] == {"fairshare": 0.5, "queue": 1.0, "urgency": 1.0, "age": 0.5, "jobsize": 0.25}
    assert parts["priority"] == pytest.approx(500 + 100 + 31 + 25 + 2.5)
    # The scheduler's split: bucket base (fair share) + the job's own term.
    assert prio.base(0.5) + prio.term(job, 50.0) == pytest.approx(parts["priority"])


def test_age_saturates_and_default_weights_keep_urgency_order_within_a_user() -> None:
    prio = Priority(Weights(max_age=100.0), {"q": 0})
    old = _job(urgency=16, submit_time=0.0, queue="q")
    assert prio.factors(old, 1000.0)["age"] == 1.0
    # At the default weights one urgency step outweighs an hour of waiting, not a day.
    prio7 = Priority(Weights(), {"q": 0})
    older = _job(urgency=16, submit_time=0.0, queue="q")
    assert prio7.term(_job(urgency=17, submit_time=3600.0, queue="q"), 3600.0) > prio7.term(older, 3600.0)
    assert prio7.term(_job(urgency=17, submit_time=86400.0, queue="q"), 86400.0) < prio7.term(older, 86400.0)
    # And fair share outweighs urgency entirely.
    assert prio7.base(1.0) + prio7.term(_job(urgency=0), 0) > prio7.base(0.5) + prio7.term(_job(urgency=31), 0)
