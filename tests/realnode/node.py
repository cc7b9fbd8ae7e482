"""The real node: Debian's containerd (CRI) with runc and the bridge CNI plugin, and the kubelet, kube-scheduler
and kube-proxy v1.20.2 that .ci/kubernetes.sh builds, joined to tier (c)'s control plane (Cluster).

Everything a pod meets is real here: image unpacking and the runtime's default seccomp profile, cgroups, volumes
(projected, emptyDir, memory), security contexts, the pod network, ClusterIP Services through kube-proxy's
iptables rules, exec, logs, graceful deletion and eviction.  What the tier adds beside it (cluster DNS, the Job
features the 1.20 API server drops, a provisioner) is in dns.py, indexed.py and conftest.py, each a named
stand-in.

Nothing here touches the host's own containerd or CNI: the runtime has its own socket, state and CNI config
under the run directory, its image store under the cache (so imported images survive a run), its own bridge.
"""
from __future__ import annotations

import contextlib
import json
import queue
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from tests.operator.k8s_control_plane import ADMIN_TOKEN, Cluster, free_port

NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy", "kubectl")
HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ip", "buildah")
CNI_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
POD_CIDR = "10.244.0.0/24"
BRIDGE = "mcrn0"
CAP_SYS_RESOURCE = 24


def host_address() -> str:
    """The address of the default route's interface: what the API server advertises and the node reports (a
    UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.53", 53))
        return str(s.getsockname()[0])


def can_lower_oom_score() -> bool:
    """Root without CAP_SYS_RESOURCE (some CI VMs) cannot set a negative oom_score_adj, which the kubelet asks for
    every pause container: runc then fails every sandbox with "can't get final child's PID from pipe"."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    return False


@dataclass
class RealNode:
    cluster: Cluster
    bin_dir: Path
    run_dir: Path
    cache_dir: Path
    dns: str  # the kubelet's clusterDNS: what every pod's resolv.conf names
    sandbox_image: str  # the pause image
    images_script: Path  # .ci/realnode.sh: built the images, imports them
    name: str = "realnode"
    address: str = field(default_factory=host_address)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.run_dir / "containerd" / "containerd.sock"

    def start(self) -> None:
        self._start_containerd()
        subprocess.run(["bash", str(self.images_script), "import", str(self.socket)], check=True, timeout=600,
                       stdout=subprocess.DEVNULL)
        self._remove_containers()  # a crashed run's; the kubelet would not know them
        kubeconfig = self.cluster.admin_kubeconfig()
        self._spawn("kube-scheduler", [f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--port=0",
                                       f"--secure-port={free_port()}"])
        # --conntrack-max-per-core=0: leave the machine's conntrack sysctls as they are.
        self._spawn("kube-proxy", [f"--kubeconfig={kubeconfig}", f"--hostname-override={self.name}",
                                   "--proxy-mode=iptables", f"--cluster-cidr={POD_CIDR}",
                                   "--conntrack-max-per-core=0", f"--metrics-bind-address=127.0.0.1:{free_port()}",
                                   f"--healthz-bind-address=127.0.0.1:{free_port()}"])
        self._spawn("kubelet", [
            f"--config={self._kubelet_config()}", f"--kubeconfig={kubeconfig}", f"--hostname-override={self.name}",
            f"--node-ip={self.address}", f"--root-dir={self.run_dir / 'kubelet'}",
            f"--cert-dir={self.run_dir / 'kubelet-pki'}", "--container-runtime=remote",
            f"--container-runtime-endpoint=unix://{self.socket}", "--runtime-request-timeout=5m", "-v=2",
            f"--pod-infra-container-image={self.sandbox_image}"])  # only so that image GC spares it
        self._wait_ready()

    def stop(self) -> None:
        """Pods first, through the API, so the kubelet itself runs CNI DEL and unmounts volumes; then the
        processes; then whatever a dead kubelet left."""
        with contextlib.suppress(OSError, urllib.error.URLError):
            self.write_diagnostics(self.run_dir / "pods.txt")
            self._delete_all_pods()
        for name in ("kubelet", "kube-proxy", "kube-scheduler"):
            self._end(name)
        for task in self.ctr("tasks", "ls", "-q", check=False).split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        self._remove_containers()
        self._end("containerd")
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(self.run_dir))]
        for mount in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        subprocess.run([str(self.bin_dir / "kube-proxy"), "--cleanup"], check=False, capture_output=True,
                       timeout=60)
        subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", f"/var/lib/cni/networks/{BRIDGE}"], check=False)

    def kill(self, namespace: str, pod: str, container: str = "minicluster") -> None:
        """SIGKILL a running container's process as the runtime sees it (what an OOM kill or a crash does)."""
        labels = {"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": pod,
                  "io.kubernetes.container.name": container}
        # One filter, its terms joined by commas, is an AND (separate filters would be an OR).
        listed = self.ctr("containers", "ls", "-q", ",".join(f'labels."{k}"=={v}' for k, v in labels.items())).split()
        running = set(self.ctr("tasks", "ls", "-q").split())
        [target] = [c for c in listed if c in running]
        self.ctr("tasks", "kill", "-s", "SIGKILL", target)

    def exit_waiter(self, container: str, timeout: float = 90) -> Callable[[], int | None]:
        """Subscribe to containerd's events now, and return the wait for the exit of `container`'s task (its
        PID 1) with its status; None if it did not exit within `timeout`.  The subscription is certain once this
        returns: a namespace label change, made until it shows, has been seen through it."""
        events = subprocess.Popen(["ctr", "--address", str(self.socket), "events"], stdout=subprocess.PIPE, text=True)
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            for line in events.stdout or ():
                lines.put(line)
            lines.put(None)
        threading.Thread(target=read, daemon=True).start()

        def finish() -> None:
            events.kill()
            events.communicate()  # and closes its stdout

        deadline = time.monotonic() + 30
        while not self._probe_seen(lines):
            if time.monotonic() > deadline or events.poll() is not None:
                finish()
                raise RuntimeError("ctr events did not show the probe")

        def wait() -> int | None:
            try:
                end = time.monotonic() + timeout
                while (left := end - time.monotonic()) > 0:
                    try:
                        line = lines.get(timeout=left)
                    except queue.Empty:
                        break
                    if line is None:
                        break
                    _, _, payload = line.partition(" /tasks/exit ")
                    exited = json.loads(payload) if payload else {}
                    if exited.get("container_id") == container and exited.get("id") == container:
                        return int(exited.get("exit_status", 0))  # zero is left out of the event
                return None
            finally:
                finish()
        return wait

    def _probe_seen(self, lines: queue.Queue[str | None]) -> bool:
        self.ctr("namespaces", "label", "k8s.io", f"minicluster.dev/probe={time.monotonic_ns()}")
        try:
            while (line := lines.get(timeout=0.5)) is not None:
                if " /namespaces/update " in line:
                    return True
        except queue.Empty:
            pass
        return False

    def logs(self, namespace: str, pod: str, container: str = "minicluster") -> str:
        """The container's log as `kubectl logs` reads it: the kubelet's, through the API server."""
        return self.api(f"/api/v1/namespaces/{namespace}/pods/{pod}/log?container={container}", raw=True)

    def api(self, path: str, method: str = "GET", body: Any = None, raw: bool = False) -> Any:
        request = urllib.request.Request(
            self.cluster.server + path, method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"})
        context = ssl.create_default_context(cafile=str(self.cluster.ca_path))
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            data = response.read().decode(errors="replace")
        return data if raw else json.loads(data)

    def ctr(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        done = subprocess.run(["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    # --- the runtime -----------------------------------------------------------------------------------------

    def _start_containerd(self) -> None:
        directory = self.run_dir / "containerd"
        (directory / "cni").mkdir(parents=True, exist_ok=True)
        (directory / "cni" / "10-minicluster.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": BRIDGE, "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}}]}))
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = directory / "config.toml"
        config.write_text(f"""version = 2
root = "{self.cache_dir / 'containerd-root'}"
state = "{directory / 'state'}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[{cri}]
  sandbox_image = "{self.sandbox_image}"
  restrict_oom_score_adj = {str(not can_lower_oom_score()).lower()}
  disable_apparmor = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{CNI_DIR}"
  conf_dir = "{directory / 'cni'}"
""")
        with subprocess.Popen(["sysctl", "-qw", "net.ipv4.ip_forward=1"]) as sysctl:
            sysctl.wait(10)
        self._spawn("containerd", ["--config", str(config)], binary="containerd")
        deadline = time.monotonic() + 30
        while self.ctr("version", check=False) == "":
            if time.monotonic() > deadline or self.processes["containerd"].poll() is not None:
                raise RuntimeError(f"containerd did not start:\n{self.log('containerd')}")
            time.sleep(0.2)

    def _remove_containers(self) -> None:
        for container in self.ctr("containers", "ls", "-q", check=False).split():
            self.ctr("tasks", "rm", "-f", container, check=False)
            self.ctr("containers", "rm", container, check=False)

    def _kubelet_config(self) -> Path:
        path = self.run_dir / "kubelet.json"
        path.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.address, "port": free_port(), "healthzPort": free_port(), "readOnlyPort": 0,
            # The API server calls the kubelet (exec, logs) without a client certificate in this test cluster.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "failSwapOn": False,
            "clusterDomain": "cluster.local", "clusterDNS": [self.dns], "podCIDR": POD_CIDR,
            # The images were imported, not pulled: garbage collection must leave them.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "serializeImagePulls": False,
        }))
        return path

    # --- processes -------------------------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], binary: str | None = None) -> None:
        executable = binary or str(self.bin_dir / name)
        with open(self.run_dir / f"{name}.log", "wb") as log:
            self.processes[name] = subprocess.Popen([executable, *args], stdout=log, stderr=subprocess.STDOUT,
                                                    start_new_session=True)

    def _end(self, name: str) -> None:
        proc = self.processes.pop(name, None)
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def log(self, name: str) -> str:
        return (self.run_dir / f"{name}.log").read_text(errors="replace")[-4000:]

    def _wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self.processes.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0]} exited:\n{self.log(dead[0])}")
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                node = self.api(f"/api/v1/nodes/{self.name}")
                if any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]):
                    return
            time.sleep(0.5)
        raise RuntimeError(f"node {self.name} not Ready in {timeout}s:\n{self.log('kubelet')}")

    def write_diagnostics(self, path: Path) -> None:
        """Every pod left at the end, its state and its log's tail: a failed CI run's evidence."""
        with path.open("w") as out:
            for pod in self.api("/api/v1/pods")["items"]:
                meta, status = pod["metadata"], pod.get("status") or {}
                out.write(f"== {meta['namespace']}/{meta['name']} {status.get('phase')} "
                          f"{json.dumps(status.get('containerStatuses'))}\n")
                for c in pod["spec"]["containers"]:
                    with contextlib.suppress(OSError, urllib.error.URLError):
                        log = self.logs(meta["namespace"], meta["name"], c["name"])
                        out.write("".join(f"   {line}\n" for line in log.splitlines()[-40:]))

    def _delete_all_pods(self, timeout: float = 90) -> None:
        for ns in self.api("/api/v1/namespaces")["items"]:
            name = ns["metadata"]["name"]
            if name not in ("default", "kube-system", "kube-public", "kube-node-lease"):
                self.api(f"/api/v1/namespaces/{name}", method="DELETE")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.api("/api/v1/pods")["items"]:
            for pod in self.api("/api/v1/pods")["items"]:
                meta = pod["metadata"]
                if not meta.get("deletionTimestamp"):
                    with contextlib.suppress(urllib.error.HTTPError):
                        self.api(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", method="DELETE")
            time.sleep(1)

