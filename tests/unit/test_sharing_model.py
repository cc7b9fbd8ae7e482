"""Sharing config (minicluster/model/sharing.py through InstanceConfig) and the accounting arithmetic
(broker/share/accounting.py).  Pure."""
from __future__ import annotations

import tomllib

import pytest

from broker.share.accounting import Acct, finish_statements, record, usage_of_result
from minicluster import config as config_mod
from minicluster.model.sharing import Limits

SHARING = {
    "queues": {"batch": {"limits": {"cores": 512}, "user_limits": {"running_jobs": 10, "queued_jobs": 1000},
                         "default_time_limit": "1h", "max_time_limit": "1d"},
               "debug": {"priority": 100, "requires": ["zone=a"], "max_time_limit": 1800},
               "scavenger": {"preemptible": True, "preempt_mode": "cancel"}},
    "default_queue": "batch",
    "banks": {"physics": {"shares": 2, "users": {"alice": 1, "1001": 3}},
              "theory": {"parent": "physics", "users": ["bob"]}},
    "default_projects": {"alice": "physics"},
    "priority": {"age": 500, "half_life": "2d", "gpu_weight": 8},
}


def test_sharing_parses_and_survives_the_toml_round_trip() -> None:
    cfg = config_mod.from_mapping(SHARING)
    share = cfg.sharing
    assert [q.name for q in share.queues] == ["batch", "debug", "scavenger"]
    batch = share.queue("batch")
    assert batch.limits == Limits(cores=512) and batch.user_limits == Limits(running_jobs=10, queued_jobs=1000)
    assert (batch.default_time_limit, batch.max_time_limit) == (3600.0, 86400.0)
    assert share.queue("debug").requires == ("zone=a",) and share.max_queue_priority == 100
    assert share.queue("scavenger").preemptible and share.queue("scavenger").preempt_mode == "cancel"
    assert share.banks[0].users == (("alice", 1), ("1001", 3)) and share.banks[1].parent == "physics"
    assert share.weights.half_life == 2 * 86400 and share.weights.age == 500 and share.weights.fairshare == 100_000
    again = config_mod.from_mapping(tomllib.loads(cfg.to_toml()))
    assert again.sharing == share


def test_without_queues_there_is_one_default_queue() -> None:
    share = config_mod.InstanceConfig().sharing
    assert [q.name for q in share.queues] == ["default"] and share.default_queue == "default"


@pytest.mark.parametrize(("settings", "message"), [
    ({"queues": {"a": {"limits": {"cpus": 1}}}}, "queues.a.limits: unknown key(s) cpus"),
    ({"queues": {"a": {"limits": {"cores": -1}}}}, "queues.a.limits.cores: must be an integer"),
    ({"queues": {"a": {"priority": "high"}}}, "queues.a.priority: must be an integer"),
    ({"queues": {"a b": {}}}, "queues: 'a b' is not a valid name"),
    ({"queues": {"a": {"max_time_limit": "2 weeks"}}}, "queues.a.max_time_limit: '2 weeks' is not a duration"),
    ({"queues": {"a": {"default_time_limit": 60, "max_time_limit": 30}}}, "exceeds max_time_limit"),
    ({"queues": {"a": {"preempt_mode": "kill"}}}, "queues.a.preempt_mode: must be one of requeue, cancel"),
    ({"queues": {"a": {"color": 1}}}, "queues.a: unknown key(s) color"),
    ({"default_queue": "nope"}, "default_queue: 'nope' is not a queue"),
    ({"banks": {"a": {"parent": "b"}}}, "banks.a.parent: 'b' is not a bank"),
    ({"banks": {"a": {"parent": "b"}, "b": {"parent": "a"}}}, "loops"),
    ({"banks": {"root": {}}}, "banks.root: 'root' is the implicit top"),
    ({"banks": {"a": {"users": {"alice": -2}}}}, "banks.a.users.alice: must be an integer"),
    ({"default_projects": {"alice": "nope"}}, "default_projects.alice: 'nope' is not a bank"),
    ({"priority": {"age": -1}}, "priority.age: must be a number"),
    ({"priority": {"half_life": 0}}, "priority.half_life: must be positive"),
    ({"priority": {"weight": 1}}, "priority: unknown key(s) weight"),
    ({"queues": 3}, "queues must be dict"),
])
def test_bad_sharing_settings_name_the_key(settings: dict, message: str) -> None:
    with pytest.raises(config_mod.ConfigError, match=None) as info:
        config_mod.from_mapping(settings)
    assert message in str(info.value)


def test_usage_record_of_a_plain_job_and_of_an_array() -> None:
    acct = Acct()
    acct.add(10.0, 20.0, cpu=5.0, rss=1000)
    acct.add(10.0, 15.0, cpu=1.0, rss=3000)
    plain = record(acct, array=False, ntasks=2, cores=8, gpus=2, mem_per_task=4, t_run=10.0, now=30.0)
    # a plain job holds all 8 cores from its start to its last task's end
    assert (plain.wall, plain.core_seconds, plain.gpu_seconds, plain.cpu_seconds) == (10.0, 80.0, 20.0, 6.0)
    assert plain.cpu_efficiency == pytest.approx(6 / 80) and plain.max_rss == 3000
    assert plain.memory_efficiency == pytest.approx((3000 / 1024) / 4)
    array = record(acct, array=True, ntasks=2, cores=1, gpus=0, mem_per_task=0, t_run=10.0, now=30.0)
    assert array.core_seconds == 15.0 and array.memory_efficiency is None  # per element: 10 s + 5 s
    never = record(Acct(), array=False, ntasks=1, cores=4, gpus=0, mem_per_task=0, t_run=None, now=30.0)
    assert never.core_seconds == 0 and never.cpu_efficiency is None


def test_eight_cores_asked_one_used_is_twelve_and_a_half_percent() -> None:
    acct = Acct()
    acct.add(0.0, 100.0, cpu=100.0)
    assert record(acct, False, 1, 8, 0, 0, 0.0, 100.0).cpu_efficiency == 0.125


def test_usage_is_split_over_the_hours_a_job_ran() -> None:
    acct = Acct()
    acct.add(3600.0 * 10 + 1800, 3600.0 * 12 + 1800)  # 10:30 to 12:30
    usage = record(acct, False, 1, 2, 0, 0, None, 0.0)
    rows = [params for sql, params in finish_statements(7, 1000, "physics", "batch", usage, 0)[1:]]
    assert [(r[0], r[4]) for r in rows] == [(10, 0), (11, 0), (12, 1)]   # the job counts in its last hour
    assert [r[5] for r in rows] == pytest.approx([1800 * 2, 3600 * 2, 1800 * 2])


def test_result_usage_is_the_map_after_the_attempt() -> None:
    base = [1, 0, 0, 0, None, None, 1.0, 2.0]
    assert usage_of_result(base) == (0.0, 0) and usage_of_result([*base, 2]) == (0.0, 0)
    assert usage_of_result([*base, 0, {"cpu": 1.5, "rss": 2048}]) == (1.5, 2048)
    assert usage_of_result([*base, 3, {"cpu": 1.5, "rss": 2048}]) == (1.5, 2048)   # after an attempt number
    assert usage_of_result([*base, 0, {"cpu": -1, "rss": "x"}]) == (0.0, 0)         # garbage is ignored
