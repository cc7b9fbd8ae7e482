"""RankTable (broker/ranks.py), rank liveness at rank 0 (protocol.md §2.6), driven by a FakeClock: no sockets."""
from __future__ import annotations

import pytest

from broker.ranks import RankState, RankTable
from minicluster.testing import FakeClock

UNRESPONSIVE, LOST = 1.0, 3.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def table(size: int = 3, tree_size: int = 4) -> RankTable:
    return RankTable(size, tree_size, lambda r: f"ipc:///tmp/r{r}", UNRESPONSIVE, LOST)


def state(t: RankTable, rank: int) -> RankState:
    return t.ranks[rank].state


def joined(clock: FakeClock, *ranks: int) -> RankTable:
    t = table()
    for r in ranks:
        t.joined(r, clock(), pid=100 + r, hostname=f"h{r}")
    return t


def test_a_rank_is_never_joined_until_it_joins(clock: FakeClock) -> None:
    t = table()
    assert all(state(t, r) is RankState.NEVER for r in range(4))
    assert not t.is_member(1) and not t.all_up()
    assert t.heartbeat(1, clock()) is False, "a heartbeat cannot stand in for a join"
    t.joined(1, clock(), pid=7, hostname="n1")
    assert state(t, 1) is RankState.UP and t.is_member(1)
    assert t.ranks[1].pid == 7 and t.ranks[1].hostname == "n1" and t.ranks[1].endpoint == "ipc:///tmp/r1"


def test_silence_makes_a_rank_unresponsive_then_lost_once(clock: FakeClock) -> None:
    t = joined(clock, 0, 1, 2)
    clock.advance(UNRESPONSIVE - 0.01)
    assert t.sweep(clock()) == [] and state(t, 1) is RankState.UP
    clock.advance(0.01)
    assert t.sweep(clock()) == [] and state(t, 1) is RankState.UNRESPONSIVE
    assert t.is_member(1), "unresponsive is still a member: its tasks are not given up yet"
    clock.advance(LOST - UNRESPONSIVE)
    assert t.sweep(clock()) == [1, 2]
    assert state(t, 1) is RankState.LOST and not t.is_member(1)
    clock.advance(LOST)
    assert t.sweep(clock()) == [], "a lost rank is reported lost once"


def test_rank_zero_is_never_lost_by_silence(clock: FakeClock) -> None:
    t = joined(clock, 0, 1)
    clock.advance(10 * LOST)
    assert t.sweep(clock()) == [1]
    assert state(t, 0) is RankState.UP


def test_a_heartbeat_or_any_message_revives_an_unresponsive_rank(clock: FakeClock) -> None:
    t = joined(clock, 1, 2)
    clock.advance(UNRESPONSIVE)
    t.sweep(clock())
    assert state(t, 1) is state(t, 2) is RankState.UNRESPONSIVE
    assert t.heartbeat(1, clock()) is True
    t.seen(2, clock())
    assert state(t, 1) is state(t, 2) is RankState.UP
    clock.advance(LOST - 0.01)
    assert t.sweep(clock()) == [], "the revival restarted the silence"


def test_a_lost_rank_must_rejoin(clock: FakeClock) -> None:
    t = joined(clock, 1)
    clock.advance(LOST)
    assert t.sweep(clock()) == [1]
    assert t.heartbeat(1, clock()) is False
    t.seen(1, clock())
    assert state(t, 1) is RankState.LOST, "a message alone does not readmit a lost rank"
    t.joined(1, clock(), pid=8, hostname="n1")
    assert state(t, 1) is RankState.UP and t.ranks[1].pid == 8


def test_time_rank_zero_was_stalled_is_forgiven(clock: FakeClock) -> None:
    t = joined(clock, 1)
    clock.advance(LOST + 5)  # rank 0 did not read for this long: the rank's messages wait in the socket
    assert t.sweep(clock(), stalled=LOST + 5) == []
    assert state(t, 1) is RankState.UP
    clock.advance(LOST)
    assert t.sweep(clock()) == [1], "only the stall is forgiven, not what follows"


def test_counts_and_rows_cover_the_expected_size_and_every_joined_rank(clock: FakeClock) -> None:
    t = joined(clock, 0, 1, 3)  # rank 3 is beyond size 3: it joined ahead of a scale-up
    assert t.counts() == {"never-joined": 1, "up": 2, "unresponsive": 0, "lost": 0, "expected": 3}
    assert [(r["rank"], r["state"]) for r in t.rows()] == [(0, "up"), (1, "up"), (2, "never-joined"), (3, "up")]
    t.joined(2, clock(), pid=None, hostname="")
    assert t.all_up()
    t.resize(4)
    assert t.counts()["expected"] == 4 and t.all_up()
    t.resize(2)
    assert t.counts() == {"never-joined": 0, "up": 2, "unresponsive": 0, "lost": 0, "expected": 2}


def scanned_counts(t: RankTable) -> dict[str, int]:
    """The counts as a scan of every expected rank finds them: what RankTable's kept counts must equal."""
    out = {s.value: 0 for s in RankState}
    for r in range(t.size):
        out[t.ranks[r].state.value] += 1
    return out | {"expected": t.size}


def swept_by_scan(t: RankTable, now: float) -> bool:
    """What a sweep at `now` leaves, checked over every rank: no member (but rank 0) silent as long as `lost_after`,
    none up that was silent as long as `unresponsive_after`, none unresponsive that was heard from since."""
    for info in t.ranks.values():
        if info.rank == 0 or info.state not in (RankState.UP, RankState.UNRESPONSIVE):
            continue
        silent = now - info.last_seen
        if silent >= LOST or (info.state is RankState.UP) != (silent < UNRESPONSIVE):
            return False
    return True


def test_the_kept_counts_stay_exact_through_every_transition(clock: FakeClock) -> None:
    """Joins, repeated joins, heartbeats, messages, silence (unresponsive, lost), rejoins and resizes in a
    seeded random order, with ranks beyond `size` among them: after each step the counts and all_up are a scan's,
    and after each sweep every rank's state is what its silence says (the sweep reads only the silent ones)."""
    import random
    rng = random.Random(29)
    t = RankTable(8, 12, lambda r: f"ipc:///tmp/r{r}", UNRESPONSIVE, LOST)
    kinds = set()
    for _ in range(3000):
        rank = rng.randrange(12)
        step = rng.choice(("join", "heartbeat", "seen", "sweep", "stalled sweep", "resize"))
        kinds.add((step, t.ranks[rank].state))
        if step == "join":
            t.joined(rank, clock(), pid=rng.randrange(3), hostname="n")
        elif step == "heartbeat":
            t.heartbeat(rank, clock())
        elif step == "seen":
            t.seen(rank, clock())
        elif step == "sweep":
            t.sweep(clock.advance(rng.choice((0.0, 0.5, UNRESPONSIVE, LOST))))
        elif step == "stalled sweep":
            t.sweep(clock.advance(LOST), stalled=LOST)
        else:
            t.resize(rng.randrange(1, 13))
        assert t.counts() == scanned_counts(t), step
        if "sweep" in step:
            assert swept_by_scan(t, clock()), step
        assert t.all_up() == all(t.ranks[r].state is RankState.UP for r in range(t.size)), step
    assert len(kinds) == 6 * len(RankState), "every step was taken from every state"


def test_all_up_follows_a_resize_and_an_unresponsive_rank(clock: FakeClock) -> None:
    t = joined(clock, 0, 1, 2)
    assert t.all_up()
    t.resize(4)
    assert not t.all_up() and t.counts()["never-joined"] == 1
    t.joined(3, clock(), pid=1, hostname="n3")
    assert t.all_up()
    clock.advance(UNRESPONSIVE)
    t.heartbeat(1, clock())
    t.heartbeat(2, clock())
    t.sweep(clock())
    assert not t.all_up() and t.counts()["unresponsive"] == 1
    t.resize(3)
    assert t.all_up(), "the silent rank is no longer expected"
    t.resize(4)
    assert not t.all_up()
    t.seen(3, clock())
    assert t.all_up()
