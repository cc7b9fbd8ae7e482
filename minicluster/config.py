"""Instance configuration: one TOML file read by `mc broker` and `mc worker`.

The same file is written by `mc start` for local instances and rendered into a
ConfigMap by the operator (`minicluster/operator/`). Keys are documented in
docs/architecture.md#configuration.
"""
from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minicluster.model import restree
from minicluster.model import sharing as sharing_mod
from minicluster.model.jobterms import POLICIES


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or has a bad value."""


_HOUR, _YEARS = 3600.0, 1e9  # seconds; 1e9 is some 30 years, "as good as never" for a limit
# Every numeric key's range, least and most: a value outside it (or NaN) is refused naming the key. A heartbeat of
# 0 would busy-loop every rank; inf is allowed only where it means something (dispatch_window_grace: never recall).
NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "size": (1, 100_000), "max_size": (0, 100_000), "fanout": (1, 100_000),
    "port_base": (0, 65_535), "status_port": (0, 65_535),
    "heartbeat_interval": (0.01, _HOUR), "unresponsive_after": (0.01, _YEARS), "lost_after": (0.01, _YEARS),
    "reattach_timeout": (0, _YEARS), "default_time_limit": (1, _YEARS), "kill_grace": (0, _HOUR),
    "submit_stall_timeout": (0.001, _YEARS), "output_cap": (0, 1 << 40), "purge_max_age": (0, _YEARS),
    "purge_max_count": (0, 1 << 40), "finished_cache": (0, 1 << 30), "dispatch_window": (0, 1 << 16),
    "dispatch_window_seconds": (0, _YEARS), "dispatch_window_grace": (0, float("inf")),
}


@dataclass(frozen=True)
class InstanceConfig:
    name: str = "minicluster"
    size: int = 1
    # The tree is laid out over max_size ranks so that growing the instance
    # never changes an existing rank's parent.
    max_size: int = 0
    fanout: int = 32
    # Overlay endpoint of each rank: "{rank}" is substituted, and "{port}" by port_base + rank (for
    # several ranks on one host).  tcp:// or ipc://.
    endpoint: str = "tcp://127.0.0.1:8050"
    port_base: int = 0
    # Where the overlay ROUTERs and the status server listen: "" = the host of the rank's own endpoint (an
    # address as given, a name resolved at start); "*" = every interface, IPv4 and IPv6 (what pods use: their
    # own DNS name may not resolve yet when they start); or one address.
    listen: str = ""
    curve_cert: str = ""
    state_dir: str = "/var/lib/minicluster"
    # Client socket of the broker (unix domain, mode 0600 or 0660 with access_group).
    socket: str = ""
    access_group: str = ""
    # Broker HTTP status endpoint for the operator; 0 turns it off.
    status_port: int = 0
    heartbeat_interval: float = 1.0
    unresponsive_after: float = 3.0
    lost_after: float = 10.0
    # How long a restarted broker waits for workers to reclaim running jobs.
    reattach_timeout: float = 30.0
    default_time_limit: float = 3600.0
    kill_grace: float = 5.0
    # How long a submission may wait for the journal (a full disk) before it is refused, never to run.
    submit_stall_timeout: float = 5.0
    output_cap: int = 16 * 1024 * 1024
    purge_max_age: float = 7 * 24 * 3600.0
    purge_max_count: int = 100_000
    # How many finished jobs rank 0 keeps in memory; the others are read from the journal when asked for.
    finished_cache: int = 10_000
    policy: str = "first-fit"
    # The PMI a job of several tasks gets when it does not say (--mpi) and its program's ELF file links no
    # known MPI: "pmi1", "pmix" or "auto" (both).
    mpi_default: str = "pmi1"
    test_exec: bool = False
    # Whether rank 0 offers its node to jobs (Flux's default) or keeps it for the broker alone.
    broker_runs_tasks: bool = True
    # Array elements and small single jobs rank 0 sends each worker ahead of every busy one-slot core
    # (protocol.md §2.10), at most `dispatch_window` (0: none) and as many as take about `dispatch_window_seconds`
    # to run.
    dispatch_window: int = 32
    dispatch_window_seconds: float = 0.05
    # How much longer than its expected run time a single job may run before the chain waiting behind it goes back
    # to the queue (protocol.md §2.10): more for jobs whose run times vary more (inf: never).
    dispatch_window_grace: float = 1.0
    # Spawn helper processes per rank (docs/architecture.md, "Spawn helpers"): a number (0: tasks are spawned on
    # the agent's event loop), or "auto": none on small nodes, more with the node's cores (worker/helpers.py).
    spawn_helpers: int | str = "auto"
    # Properties and resource override for workers, "k=v,k2" / "cores=64,gpus=4".
    properties: str = ""
    resources: str = ""
    # Topology levels above the node from rank properties, top down (docs/scheduling.md):
    # "zone=topology.kubernetes.io/zone,rack=example.com/rack".
    topology: str = ""
    # A JSON Graph Format file describing every rank (Fluxion's JGF); its levels replace `topology`.
    resource_graph: str = ""
    # Sharing (minicluster/model/sharing.py, docs/scheduling.md): named queues, the one jobs go to when they
    # name none, the bank tree, users' default banks and the multifactor priority weights.
    queues: dict[str, Any] = field(default_factory=dict)
    default_queue: str = ""
    banks: dict[str, Any] = field(default_factory=dict)
    default_projects: dict[str, Any] = field(default_factory=dict)
    priority: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, (least, most) in NUMBER_RANGES.items():
            value = getattr(self, key)
            if not least <= value <= most:  # NaN too
                raise ConfigError(f"{key} must be a number from {least:g} to {most:g}, got {value!r}")
        if self.max_size and self.max_size < self.size:
            raise ConfigError(f"max_size {self.max_size} is smaller than size {self.size}")
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.mpi_default not in ("pmi1", "pmix", "auto"):
            raise ConfigError(f"mpi_default must be pmi1, pmix or auto, got {self.mpi_default!r}")
        if not self.broker_runs_tasks and self.tree_size == 1:
            raise ConfigError("broker_runs_tasks = false leaves no rank to run tasks: size (or max_size) must be >= 2")
        if not (self.spawn_helpers == "auto" or (type(self.spawn_helpers) is int and 0 <= self.spawn_helpers <= 256)):
            raise ConfigError(f"spawn_helpers must be \"auto\" or a number of helpers per rank from 0 to 256,"
                              f" got {self.spawn_helpers!r}")
        if not self.endpoint.startswith(("tcp://", "ipc://")):
            raise ConfigError(f"endpoint must be tcp:// or ipc://, got {self.endpoint!r}")
        try:
            _ = self.levels  # parses `topology`
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.topology and self.resource_graph:
            raise ConfigError("topology and resource_graph both name the levels; the graph file"
                              " carries its own, drop topology")
        if self.socket and not os.path.isabs(self.socket):
            raise ConfigError(f"socket must be an absolute path, got {self.socket!r}")
        if len(os.fsencode(self.socket_path)) > 107:  # sun_path holds 108 bytes with the NUL
            raise ConfigError(f"socket path {self.socket_path!r} is longer than a unix socket's 107 bytes"
                              " (set socket, or a shorter state_dir)")
        if self.listen not in ("", "*") and any(c in self.listen for c in "/[] "):
            raise ConfigError(f"listen must be empty, '*' or one address, got {self.listen!r}")
        try:
            _ = self.sharing  # parses the queues, banks and weights
        except sharing_mod.SharingError as exc:
            raise ConfigError(str(exc)) from None

    def check_access_group(self) -> None:
        """ConfigError unless `access_group` is empty or names a group of this host: checked where the broker
        starts (mc start, mc broker), since the config may be written on another host (the operator)."""
        if not self.access_group:
            return
        import grp

        try:
            grp.getgrnam(self.access_group)
        except KeyError:
            raise ConfigError(f"access_group {self.access_group!r} is not a group of this host"
                              " (create it, or leave access_group empty)") from None

    @functools.cached_property
    def sharing(self) -> sharing_mod.Sharing:
        """The queues, banks and priority weights, parsed (a config without queues has one: `default`)."""
        return sharing_mod.parse(self.queues, self.default_queue, self.banks, self.default_projects,
                                 self.priority)

    @property
    def levels(self) -> tuple[tuple[str, str], ...]:
        """`topology` parsed: (level, node property) pairs, top down."""
        return restree.parse_levels(self.topology)

    @property
    def tree_size(self) -> int:
        return max(self.size, self.max_size)

    @property
    def socket_path(self) -> str:
        return self.socket or os.path.join(self.state_dir, "run", "broker.sock")

    @property
    def node_properties(self) -> str:
        """The config's properties, this process's MC_PROPERTIES, and the topology levels' properties a pod was
        given as MC_TOPOLOGY_<i> (the operator maps each level's node label there: docs/operator.md)."""
        labelled = [f"{key}={value}" for i, (_, key) in enumerate(self.levels)
                    if (value := os.environ.get(f"MC_TOPOLOGY_{i}", "")) and "," not in value]
        return ",".join(p for p in (self.properties, os.environ.get("MC_PROPERTIES", ""), *labelled) if p)

    @property
    def single_host(self) -> bool:
        """Every rank runs on this host (ipc or loopback endpoints: `mc start`, LocalCluster), so the ranks'
        tasks share its cores whatever each rank declares."""
        if self.endpoint.startswith("ipc://"):
            return True
        host, _ = split_tcp(self.endpoint_of(0))
        return host == "localhost" or host.startswith("127.") or host == "::1"

    def endpoint_of(self, rank: int) -> str:
        return self.endpoint.replace("{rank}", str(rank)).replace("{port}", str(self.port_base + rank))

    def bind_addresses(self, rank: int) -> list[str]:
        """Where `rank` binds its ROUTER: ipc paths as they are; tcp on the listen host(s) (see `listen`)."""
        ep = self.endpoint_of(rank)
        if ep.startswith("ipc://"):
            return [ep]
        host, port = split_tcp(ep)
        return [f"tcp://{_bracketed(h)}:{port}" for h in self.listen_hosts(host)]

    def listen_hosts(self, endpoint_host: str) -> list[str]:
        """The addresses to listen on for a rank whose endpoint names `endpoint_host`; ["*"] = all."""
        if self.listen == "*":
            return ["*"]
        return resolve_host(self.listen or endpoint_host)

    def status_hosts(self) -> list[str]:
        """Where rank 0's status server listens: where its ROUTER does; loopback when the overlay is ipc."""
        ep = self.endpoint_of(0)
        return self.listen_hosts(split_tcp(ep)[0] if ep.startswith("tcp://") else "127.0.0.1")

    def replace(self, **changes: Any) -> InstanceConfig:
        return dataclasses.replace(self, **changes)

    def to_toml(self) -> str:
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            lines.append(f"{f.name} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def split_tcp(endpoint: str) -> tuple[str, int]:
    """("host", port) of "tcp://host:port" or "tcp://[v6]:port"."""
    rest = endpoint.removeprefix("tcp://")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"endpoint {endpoint!r} has no port")
    return host.removeprefix("[").removesuffix("]"), int(port)


def resolve_host(host: str) -> list[str]:
    """The addresses of `host`: an address as it is, a name through the resolver (every address, once)."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot resolve {host!r} to listen on: {exc.strerror}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        # An inline table, nested as deep as the value: TOML reads it back as the same mapping.
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _toml_key(key: Any) -> str:
    text = str(key)
    return text if text and all(c.isalnum() or c in "_-" for c in text) and text.isascii() else _toml_value(text)


def load(path: str | os.PathLike[str]) -> InstanceConfig:
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    return from_mapping(data, source=str(path))


def from_mapping(data: dict[str, Any], source: str = "config") -> InstanceConfig:
    known = {f.name: f for f in dataclasses.fields(InstanceConfig)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        expected = type(getattr(_DEFAULTS, key))
        if key in _ANY_TYPE:  # its own check says what it accepts
            values[key] = value
            continue
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ConfigError(f"{source}: {key} must be {expected.__name__}, got {value!r}")
        values[key] = value
    return InstanceConfig(**values)


_DEFAULTS = InstanceConfig()
_ANY_TYPE = frozenset({"spawn_helpers"})  # a number or a word


def write(config: InstanceConfig, path: str | os.PathLike[str]) -> None:
    tmp = Path(f"{path}.tmp")
    tmp.write_text(config.to_toml())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


__all__ = ["ConfigError", "InstanceConfig", "POLICIES", "load", "from_mapping", "write", "split_tcp", "resolve_host"]
