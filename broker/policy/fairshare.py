"""Fair share: the bank tree, decayed usage and Slurm's Fair Tree factor (docs/scheduling.md, "Fair share").

Associations are (bank, uid) pairs with shares inside their bank; banks have shares inside their parent bank, up
to `root`.  A user who is in no bank is charged to an association directly under root with one share.

Usage is core-seconds (plus `gpu_weight` per GPU-second) decayed with a half-life: an association's usage U(t)
obeys dU/dt = rate - λU with λ = ln 2 / half_life, where `rate` is what it holds right now.  Between two changes of
the rate that integrates exactly to U·e^(−λΔ) + rate·(1 − e^(−λΔ))/λ, so a start or an end costs O(1) and no job
row is ever read back.

The factor is Slurm's Fair Tree (https://slurm.schedmd.com/fair_tree.html): at every level, each child's Level
Fairshare is LF = S/U, its shares over the sum of its siblings' shares divided by its usage over the sum of its
siblings' usage (infinite without usage; the usage ranked counts the work in flight, see `Usage.ranked`);
children are visited in decreasing LF, depth first, and each user
association met gets the next rank, counting down from the number of associations.  The factor is rank / count:
all users of a bank that is under its share come before all users of a sibling bank over its share.  Sibling
users with equal LF tie and share a rank.  Pure: no I/O, no clock (`now` is passed in).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from minicluster.model.sharing import ROOT_BANK

Assoc = tuple[str, int]  # (bank, uid)
DEFAULT_SHARES = 1


# How fast the association's typical run time follows its recent ends (per element ended).
RUN_TIME_SMOOTHING = 0.05


class Usage:
    """One association's decayed usage as of `t`, the rate it is charged right now (weighted cores), and the
    typical run time of its elements (for the work in flight, see `ranked`)."""

    __slots__ = ("value", "rate", "t", "run_time")

    def __init__(self, value: float = 0.0, t: float = 0.0) -> None:
        self.value = value
        self.rate = 0.0
        self.t = t
        self.run_time = 0.0

    @property
    def ranked(self) -> float:
        """The usage Fair Tree ranks by: what accrued, plus what the work already running will add by its
        association's typical run time.  Without it, a user whose jobs just started still looks unserved (their
        usage accrues only as they run) and keeps winning every freed core until it catches up."""
        return self.value + self.rate * self.run_time

    def advance(self, now: float, decay: float) -> None:
        dt = now - self.t
        if dt <= 0:
            return
        if decay > 0:
            kept = math.exp(-decay * dt)
            self.value = self.value * kept + self.rate * (1.0 - kept) / decay
        else:
            self.value += self.rate * dt
        self.t = now


@dataclass(slots=True)
class Node:
    """A bank or a user association, as `mc bank list` shows it."""

    name: str           # bank name, or the uid as text for a user
    parent: str         # the bank it belongs to ("" for root)
    shares: int
    user: int | None = None
    usage: float = 0.0         # as ranked: accrued plus work in flight (Usage.ranked)
    norm_shares: float = 0.0   # its share of the whole machine (product of the level shares)
    level_fs: float = 0.0      # LF = S/U at its level
    factor: float = 0.0        # users only


class FairShare:
    def __init__(self, half_life: float) -> None:
        self.decay = math.log(2) / half_life if half_life > 0 else 0.0
        self.half_life = half_life if half_life > 0 else math.inf
        self.banks: dict[str, tuple[str, int]] = {}          # name -> (parent, shares)
        self.members: dict[Assoc, int] = {}                 # (bank, uid) -> shares
        self.usage: dict[Assoc, Usage] = {}
        # Associations whose rate changed since the last snapshot (a saved (value, t) stays exact under decay
        # alone, so only these, and those being charged, need saving again).
        self.dirty: set[Assoc] = set()
        self.factors: dict[Assoc, float] = {}
        self.nodes: list[Node] = []
        self.t = 0.0

    # --- the tree -----------------------------------------------------------------------------------------

    def set_bank(self, name: str, parent: str, shares: int) -> None:
        if name == ROOT_BANK:
            raise ValueError(f"{ROOT_BANK!r} is the top of the tree")
        if parent != ROOT_BANK and parent not in self.banks:
            raise ValueError(f"bank {parent!r} does not exist")
        walk = parent
        while walk != ROOT_BANK:
            if walk == name:
                raise ValueError(f"bank {name!r} cannot be under itself")
            walk = self.banks[walk][0]
        self.banks[name] = (parent, shares)

    def remove_bank(self, name: str) -> None:
        children = [b for b, (p, _) in self.banks.items() if p == name]
        if children:
            raise ValueError(f"bank {name!r} has sub-banks ({', '.join(sorted(children))}); remove them first")
        if name not in self.banks:
            raise ValueError(f"bank {name!r} does not exist")
        del self.banks[name]
        for assoc in [a for a in self.members if a[0] == name]:
            del self.members[assoc]

    def set_member(self, bank: str, uid: int, shares: int) -> None:
        if bank != ROOT_BANK and bank not in self.banks:
            raise ValueError(f"bank {bank!r} does not exist")
        self.members[(bank, uid)] = shares

    def remove_member(self, bank: str, uid: int) -> None:
        if self.members.pop((bank, uid), None) is None:
            raise ValueError(f"uid {uid} is not in bank {bank!r}")

    def banks_of(self, uid: int) -> list[str]:
        return sorted(bank for bank, user in self.members if user == uid)

    def assoc(self, uid: int, bank: str | None) -> Assoc:
        """The association a job of `uid` charges: its bank if given (it must be a member), else its first."""
        if bank is not None:
            if (bank, uid) not in self.members and not (bank == ROOT_BANK and not self.banks_of(uid)):
                raise ValueError(f"uid {uid} is not a member of bank {bank!r}")
            return (bank, uid)
        mine = self.banks_of(uid)
        return (mine[0], uid) if mine else (ROOT_BANK, uid)

    # --- usage --------------------------------------------------------------------------------------------

    def _usage(self, assoc: Assoc, now: float) -> Usage:
        found = self.usage.get(assoc)
        if found is None:
            found = self.usage[assoc] = Usage(0.0, now)
        return found

    def rate_change(self, assoc: Assoc, delta: float, now: float, ran: float = 0.0, ended: int = 0) -> None:
        """`delta` more (or fewer) weighted cores are held by the association from `now` on; `ended` elements
        that ran `ran` seconds in all just ended."""
        usage = self._usage(assoc, now)
        usage.advance(now, self.decay)
        usage.rate = max(0.0, usage.rate + delta)
        if ended:
            weight = 1.0 - (1.0 - RUN_TIME_SMOOTHING) ** ended
            usage.run_time += weight * (min(ran / ended, self.half_life) - usage.run_time)
        self.dirty.add(assoc)

    def restore(self, assoc: Assoc, value: float, t: float) -> None:
        """Usage saved earlier (after a restart): the value it had at `t`."""
        usage = self._usage(assoc, t)
        usage.value, usage.t = value, t

    def snapshot(self, now: float) -> list[tuple[str, int, float]]:
        """(bank, uid, usage at now) of the associations charged or changed since the last snapshot."""
        out = []
        for assoc, usage in self.usage.items():
            if usage.rate > 0 or assoc in self.dirty:
                usage.advance(now, self.decay)
                out.append((assoc[0], assoc[1], usage.value))
        self.dirty.clear()
        return out

    # --- the factor ---------------------------------------------------------------------------------------

    def compute(self, now: float) -> dict[Assoc, float]:
        """Fair Tree factors of every association at `now` (also kept in `factors`, and `nodes` for display)."""
        for usage in self.usage.values():
            usage.advance(now, self.decay)
        self.t = now
        children: dict[str, list[Node]] = {}
        for name, (parent, shares) in self.banks.items():
            children.setdefault(parent, []).append(Node(name, parent, shares))
        members = dict(self.members)
        for bank, uid in self.usage:
            members.setdefault((bank, uid), DEFAULT_SHARES if bank == ROOT_BANK else 0)
        for (bank, uid), shares in members.items():
            found = self.usage.get((bank, uid))
            children.setdefault(bank, []).append(
                Node(str(uid), bank, shares, user=uid, usage=found.ranked if found else 0.0))
        _sum_usage(ROOT_BANK, children)
        order: list[Node] = []
        _walk(ROOT_BANK, 1.0, children, order)
        self.nodes = order
        self.factors = _ranked([n for n in order if n.user is not None])
        return self.factors


def _sum_usage(bank: str, children: dict[str, list[Node]]) -> float:
    total = 0.0
    for node in children.get(bank, ()):
        if node.user is None:
            node.usage = _sum_usage(node.name, children)
        total += node.usage
    return total


def _walk(bank: str, norm: float, children: dict[str, list[Node]], order: list[Node]) -> None:
    """Depth first, each level in decreasing Level Fairshare; appends every node in visiting order."""
    level = children.get(bank, [])
    shares = sum(n.shares for n in level)
    usage = sum(n.usage for n in level)
    for node in level:
        s = node.shares / shares if shares else 0.0
        u = node.usage / usage if usage else 0.0
        node.norm_shares = norm * s
        node.level_fs = (math.inf if s > 0 else 0.0) if u == 0 else s / u
    level.sort(key=lambda n: (-n.level_fs, n.user is not None, -n.shares, n.name))
    for node in level:
        order.append(node)
        if node.user is None:
            _walk(node.name, node.norm_shares, children, order)


def _ranked(users: Iterable[Node]) -> dict[Assoc, float]:
    """rank / count in visiting order, counting down; sibling users with equal LF share a rank; no shares, 0."""
    users = list(users)
    count = len(users)
    factors: dict[Assoc, float] = {}
    rank = count
    previous: Node | None = None
    for i, node in enumerate(users):
        tie = (previous is not None and previous.parent == node.parent and previous.level_fs == node.level_fs)
        if not tie:
            rank = count - i
        node.factor = rank / count if node.shares > 0 else 0.0
        factors[(node.parent, node.user)] = node.factor  # type: ignore[index]
        previous = node
    return factors
