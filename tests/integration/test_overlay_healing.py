"""The overlay's healing alone (protocol.md §2.4.1), with real Overlays (ZeroMQ, CURVE over ipc) in one event loop:
a rank links around two dead levels, is reached through the rank that took it in, goes home on `home`, and the
adopter then routes the tree's way again. Fanout 2: 7 → 3 → 1 → 0."""
from __future__ import annotations

import asyncio
from pathlib import Path

from minicluster import config as config_mod
from minicluster.overlay import curve
from minicluster.overlay.transport import Overlay
from minicluster.overlay.uplink import HOME
from minicluster.proto.envelope import Message
from minicluster.testing import until_true


def _config(tmp_path: Path) -> config_mod.InstanceConfig:
    return config_mod.from_mapping({
        "name": "healing", "size": 8, "fanout": 2, "endpoint": f"ipc://{tmp_path}/rank{{rank}}.sock",
        "curve_cert": str(curve.create(tmp_path / "curve")), "state_dir": str(tmp_path),
        "heartbeat_interval": 0.1, "unresponsive_after": 0.4}, source="test")


class Ranks:
    def __init__(self, tmp_path: Path) -> None:
        self.config = _config(tmp_path)
        self.cert = curve.load(self.config.curve_cert)
        self.got: dict[int, list[Message]] = {}
        self.up: dict[int, Overlay] = {}

    def start(self, rank: int) -> Overlay:
        self.got[rank] = []
        overlay = Overlay(self.config, rank, self.cert, self.got[rank].append)
        overlay.start()
        self.up[rank] = overlay
        return overlay

    async def stop(self, rank: int) -> None:
        await self.up.pop(rank).close()

    async def delivered(self, src: int, dst: int, n: int) -> None:
        """Send `ping {n}` from `src` to `dst` until one arrives (a message sent into a link that is not up yet
        may be dropped, §2.4)."""
        want = Message("ping", src, dst, {"n": n})
        async with asyncio.timeout(20):
            while want not in self.got[dst]:
                self.up[src].send("ping", dst, {"n": n})
                await asyncio.sleep(0.1)


async def test_a_rank_links_around_two_dead_levels_and_goes_home(tmp_path: Path) -> None:
    ranks = Ranks(tmp_path)
    for rank in (0, 1, 3, 7):
        ranks.start(rank)
    leaf, root = ranks.up[7], ranks.up[0]
    try:
        await ranks.delivered(0, 7, 1)  # through 1 and 3: the tree
        assert leaf.uplink is not None and leaf.uplink.parent == 3 and not root.adopted

        await ranks.stop(3)
        await ranks.stop(1)
        await until_true(lambda: leaf.uplink is not None and leaf.uplink.parent == 0, "7 linked to rank 0")
        assert leaf.uplink.moves == 2  # 3, then 1, then 0
        await until_true(lambda: 7 in root.adopted, "rank 0 took 7 in (its attach)")
        await ranks.delivered(0, 7, 2)
        await ranks.delivered(7, 0, 3)

        ranks.start(1)
        ranks.start(3)
        await ranks.delivered(0, 3, 5)  # 3 is linked to 1, and 1 to 0
        root.send(HOME, 7, {})
        await until_true(lambda: leaf.uplink is not None and leaf.uplink.parent == 3, "7 went home")
        assert not any(m.kind == HOME for m in ranks.got[7]), "home is the transport's, not the handler's"
        # Rank 0 still holds 7 as adopted; its send to 7 finds 7 gone and takes the tree's way through 1 and 3.
        await ranks.delivered(0, 7, 4)
        assert 7 not in root.adopted
    finally:
        for rank in list(ranks.up):
            await ranks.stop(rank)


async def test_a_rank_whose_parent_never_answered_waits_for_it(tmp_path: Path) -> None:
    """The start order is the cluster's: without a first link to its tree parent a rank does not move up."""
    ranks = Ranks(tmp_path)
    ranks.start(0)
    leaf = ranks.start(3)
    try:
        # A move that does not happen has no event to wait for: five patiences (2 × 0.1 s) are the witness.
        await asyncio.sleep(1.0)
        assert leaf.uplink is not None and leaf.uplink.parent == 1 and leaf.uplink.moves == 0
        ranks.start(1)
        await ranks.delivered(0, 3, 1)
    finally:
        for rank in list(ranks.up):
            await ranks.stop(rank)


async def test_a_close_cancelled_while_draining_still_ends_the_link(tmp_path: Path) -> None:
    """A second SIGTERM can cancel a close while it waits for queued messages to leave: the link's receive and
    watch tasks must end and its socket close all the same. A watch left running moved the closed uplink up once
    the parent's link was down, on a socket the shared context had closed since (10,000 simulated ranks)."""
    ranks = Ranks(tmp_path)
    leaf = ranks.start(1)  # rank 0, its parent, never starts: what is sent to it waits
    uplink = leaf.uplink
    assert uplink is not None and uplink._sender is not None
    for n in range(10_100):  # past the socket's send queue (10,000): the rest waits in the Sender
        leaf.send("ping", 0, {"n": n})
    assert uplink._sender.pending
    closing = asyncio.ensure_future(uplink.close())
    await asyncio.sleep(0)  # the close is now waiting for the queue to drain (up to 1 s)
    assert not closing.done()
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    tasks = list(uplink._tasks)
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 2)
    assert uplink._sender is not None and uplink._sender.sock.closed
    await ranks.stop(1)
