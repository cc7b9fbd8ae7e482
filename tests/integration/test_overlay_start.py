"""Overlay lifecycle (minicluster/overlay/transport.py): constructing opens nothing, start() binds and
connects, a start that cannot bind leaves nothing behind.  Real ZeroMQ sockets with CURVE on loopback TCP."""
from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import zmq

from minicluster import config as config_mod
from minicluster.cli.launcher import local_endpoint
from minicluster.overlay import curve
from minicluster.overlay.transport import Overlay
from minicluster.proto.envelope import Message


def _config(tmp_path: Path) -> config_mod.InstanceConfig:
    endpoint, port_base = local_endpoint("tcp", tmp_path, 2)
    return config_mod.from_mapping({"name": "overlay-start", "size": 2, "fanout": 2, "endpoint": endpoint,
                                    "port_base": port_base, "curve_cert": str(curve.create(tmp_path / "curve")),
                                    "state_dir": str(tmp_path)}, source="test")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def test_overlay_binds_in_start_not_in_its_constructor(tmp_path: Path) -> None:
    config = _config(tmp_path)
    cert = curve.load(config.curve_cert)
    got: list[Message] = []
    first = Overlay(config, 0, cert, got.append)
    second = Overlay(config, 0, cert, got.append)  # the same rank twice: nothing is bound yet, so no conflict
    assert _port_free(config.port_base)
    with pytest.raises(RuntimeError, match="not started"):
        first.send("heartbeat", 1, {})
    await second.close()  # closing what never started is harmless

    first.start()
    try:
        assert not _port_free(config.port_base)
        with pytest.raises(RuntimeError, match="already started"):
            first.start()
        with pytest.raises(zmq.ZMQError):
            second.start()  # address in use: the failed start must clean up after itself
    finally:
        await first.close()
    second.start()  # so the same object starts once the address is free
    await second.close()


async def test_started_ranks_talk_over_curve(tmp_path: Path) -> None:
    config = _config(tmp_path)
    cert = curve.load(config.curve_cert)
    at_root: list[Message] = []
    root = Overlay(config, 0, cert, at_root.append)
    child = Overlay(config, 1, cert, lambda msg: None)
    root.start()
    child.start()
    try:
        child.send("heartbeat", 0, {"n": 1})  # queued by the DEALER until its CURVE handshake is done
        for _ in range(200):
            if at_root:
                break
            await asyncio.sleep(0.05)
        assert at_root == [Message("heartbeat", 1, 0, {"n": 1})]
    finally:
        await child.close()
        await root.close()
