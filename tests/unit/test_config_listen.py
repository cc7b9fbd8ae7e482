"""Where a rank binds (config `listen`) and the exit-code contract's arithmetic."""
from __future__ import annotations

import pytest

from minicluster import exitcodes
from minicluster.cli.kubectl import PluginError, remote_argv
from minicluster.config import ConfigError, InstanceConfig, split_tcp


@pytest.mark.parametrize("endpoint, listen, rank, wanted", [
    ("tcp://127.0.0.1:{port}", "", 1, ["tcp://127.0.0.1:101"]),
    ("tcp://[::1]:{port}", "", 0, ["tcp://[::1]:100"]),
    ("tcp://localhost:9000", "", 0, ["tcp://127.0.0.1:9000"]),
    ("tcp://pod-{rank}.svc.cluster.local:8050", "*", 3, ["tcp://*:8050"]),
    ("tcp://127.0.0.1:{port}", "10.0.0.7", 0, ["tcp://10.0.0.7:100"]),
    ("ipc:///run/x/overlay-{rank}.sock", "*", 2, ["ipc:///run/x/overlay-2.sock"]),
])
def test_bind_addresses(endpoint: str, listen: str, rank: int, wanted: list[str]) -> None:
    config = InstanceConfig(endpoint=endpoint, listen=listen, port_base=100, size=4)
    assert wanted[0] in config.bind_addresses(rank)


def test_status_server_listens_where_rank_0_does() -> None:
    assert InstanceConfig(endpoint="tcp://127.0.0.1:{port}", port_base=5).status_hosts() == ["127.0.0.1"]
    assert InstanceConfig(endpoint="ipc:///x/{rank}.sock").status_hosts() == ["127.0.0.1"]
    assert InstanceConfig(endpoint="tcp://a-{rank}.b:1", listen="*").status_hosts() == ["*"]


def test_unresolvable_listen_host_is_a_clear_error() -> None:
    config = InstanceConfig(endpoint="tcp://no-such-host.invalid:1")
    with pytest.raises(ConfigError, match=r"cannot resolve 'no-such-host\.invalid'"):
        config.bind_addresses(0)
    with pytest.raises(ConfigError, match="listen must be"):
        InstanceConfig(listen="tcp://0.0.0.0")
    assert split_tcp("tcp://[fd00::1]:8050") == ("fd00::1", 8050)


def test_exit_codes() -> None:
    assert exitcodes.DISRUPTED == 143 and exitcodes.stopped_by(9) == 137
    assert exitcodes.SUCCESS not in exitcodes.PROGRAM_FAILURE and exitcodes.DISRUPTED not in exitcodes.PROGRAM_FAILURE


@pytest.mark.parametrize("command, args, argv", [
    ("submit", ["-N", "2", "--", "hostname"], ["mc-submit", "-N", "2", "--", "hostname"]),
    ("jobs", ["-a"], ["mc", "jobs", "-a"]),
    ("exec", ["--", "sh", "-c", "id"], ["sh", "-c", "id"]),
])
def test_kubectl_mc_runs_the_matching_tool(command: str, args: list[str], argv: list[str]) -> None:
    assert remote_argv(command, args) == argv


def test_kubectl_mc_exec_needs_a_command() -> None:
    with pytest.raises(PluginError, match="no command"):
        remote_argv("exec", ["--"])


def test_broker_runs_tasks_false_needs_a_worker() -> None:
    with pytest.raises(ConfigError, match="broker_runs_tasks = false leaves no rank"):
        InstanceConfig(size=1, broker_runs_tasks=False)
    assert InstanceConfig(size=1, max_size=4, broker_runs_tasks=False).tree_size == 4
    assert "broker_runs_tasks = false" in InstanceConfig(size=2, broker_runs_tasks=False).to_toml()


def test_a_pods_topology_labels_become_the_levels_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    config = InstanceConfig(size=2, properties="ssd", topology="zone=topology.kubernetes.io/zone,rack=example.com/rack")
    monkeypatch.setenv("MC_PROPERTIES", "gpu")
    monkeypatch.setenv("MC_TOPOLOGY_0", "eu-1a")
    monkeypatch.setenv("MC_TOPOLOGY_1", "")  # the pod lacks the rack label: that level is skipped
    assert config.node_properties == "ssd,gpu,topology.kubernetes.io/zone=eu-1a"
    monkeypatch.setenv("MC_TOPOLOGY_1", "r7")
    assert config.node_properties.endswith(",example.com/rack=r7")


@pytest.mark.parametrize("endpoint, single", [
    ("ipc:///tmp/s/overlay-{rank}.sock", True), ("tcp://127.0.0.1:{port}", True), ("tcp://localhost:8050", True),
    ("tcp://[::1]:{port}", True), ("tcp://mc-{rank}.mc.default.svc.cluster.local:8050", False),
    ("tcp://10.0.0.{rank}:8050", False),
])
def test_single_host_is_told_by_the_endpoint(endpoint: str, single: bool) -> None:
    assert InstanceConfig(endpoint=endpoint, size=2, port_base=9000).single_host is single
