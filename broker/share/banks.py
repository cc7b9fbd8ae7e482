"""The bank tree's changes and listing (`mc bank add|remove|list`, protocol.md §3.10).

Banks and memberships written in the config belong to the config: `mc bank` may add users to them but not change
or remove them.  Everything `mc bank` changes is journaled and applied again, after the config, at every start.
A bank with active jobs cannot be removed, nor a user with active jobs in it.
"""
from __future__ import annotations

from typing import Any

from broker.job import State
from broker.jobmanager import JobError
from broker.durable.journal import Statement
from broker.share import store
from minicluster.model.sharing import MAX_SHARES, ROOT_BANK, valid_name


def _shares(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SHARES:
        raise JobError("bad-request", f"shares must be an integer in 0..{MAX_SHARES}, got {value!r}")
    return value


def add_bank(sharing: Any, name: Any, parent: Any, shares: Any) -> list[Statement]:
    if not valid_name(name) or name == ROOT_BANK:
        raise JobError("bad-request", f"{name!r} is not a valid bank name (letters, digits, '_', '.', '-'; not root)")
    if name in sharing.config_banks:
        raise JobError("bad-request", f"bank {name} is defined in the config; change it there")
    if not isinstance(parent, str):
        raise JobError("bad-request", f"parent must be a bank name, got {parent!r}")
    shares = _shares(shares)
    try:
        sharing.fairshare.set_bank(name, parent, shares)
    except ValueError as exc:
        raise JobError("not-found" if "does not exist" in str(exc) else "bad-request", str(exc)) from None
    return [store.bank_saved(name, parent, shares)]


def add_member(sharing: Any, bank: Any, uid: int, shares: Any, default: bool) -> list[Statement]:
    if bank != ROOT_BANK and bank not in sharing.fairshare.banks:
        raise JobError("not-found", f"bank {bank!r} does not exist")
    shares = _shares(shares)
    if (bank, uid) in sharing.config_members:
        raise JobError("bad-request", f"uid {uid} is in bank {bank} by the config; change it there")
    sharing.fairshare.set_member(bank, uid, shares)
    statements: list[Statement] = [store.member_saved(bank, uid, shares)]
    if default:
        sharing.defaults[uid] = bank
        statements += store.default_bank_set(uid, bank)
    return statements


def remove_bank(sharing: Any, manager: Any, name: Any) -> list[Statement]:
    if name in sharing.config_banks:
        raise JobError("bad-request", f"bank {name} is defined in the config; remove it there")
    _refuse_active(manager, lambda job: job.project == name, f"bank {name}")
    try:
        sharing.fairshare.remove_bank(name)
    except ValueError as exc:
        raise JobError("not-found" if "does not exist" in str(exc) else "bad-request", str(exc)) from None
    for uid in [u for u, b in sharing.defaults.items() if b == name]:
        del sharing.defaults[uid]
    return store.bank_removed(name)


def remove_member(sharing: Any, manager: Any, bank: Any, uid: int) -> list[Statement]:
    if (bank, uid) in sharing.config_members:
        raise JobError("bad-request", f"uid {uid} is in bank {bank} by the config; remove it there")
    _refuse_active(manager, lambda job: job.project == bank and job.uid == uid, f"uid {uid} in bank {bank}")
    try:
        sharing.fairshare.remove_member(bank, uid)
    except ValueError as exc:
        raise JobError("not-found", str(exc)) from None
    if sharing.defaults.get(uid) == bank:
        del sharing.defaults[uid]
    return [store.member_removed(bank, uid)]


def _refuse_active(manager: Any, matches: Any, what: str) -> None:
    active = [job.id for job in manager.jobs.values() if job.state != State.INACTIVE and matches(job)]
    if active:
        shown = ", ".join(map(str, active[:5])) + (" ..." if len(active) > 5 else "")
        raise JobError("bad-request", f"{what} has {len(active)} active job(s) ({shown}); "
                                      "cancel them or wait for them to end")


def listing(sharing: Any, now: float) -> list[dict[str, Any]]:
    """Every bank and user association in Fair Tree visiting order, with shares, usage and factors."""
    sharing.refresh(now)
    rows = []
    for node in sharing.fairshare.nodes:
        row = {"name": node.name, "parent": node.parent, "shares": node.shares, "norm_shares": node.norm_shares,
               "usage": node.usage, "level_fs": None if node.level_fs == float("inf") else node.level_fs}
        if node.user is None:
            row["config"] = node.name in sharing.config_banks
        else:
            row.update(uid=node.user, fairshare=node.factor, default=sharing.defaults.get(node.user) == node.parent)
        rows.append(row)
    return rows
