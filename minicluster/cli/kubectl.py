"""`kubectl mc`: run the MiniCluster tools in a MiniCluster's broker pod, found by name.

    kubectl mc submit NAME [mc-submit options] -- COMMAND...    # mc-submit
    kubectl mc run|jobs|attach|cancel|logs|... NAME [ARGS...]   # mc run, mc jobs, ...
    kubectl mc exec NAME -- COMMAND...                          # anything, e.g. a shell

kubectl runs any `kubectl-mc` on PATH as `kubectl mc`.  The plugin reads the MiniCluster, finds its running rank-0
pod (an index of its Indexed Job, or rank 0's own Job with spec.storage) and execs the tool there through the API
server, as `kubectl exec` does; the exit status is the tool's.  Credentials: KUBECONFIG / ~/.kube/config (or
--kubeconfig, --context), else the in-cluster service account.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any, cast

from minicluster.operator import pods as pods_mod
from minicluster.operator.spec import CONTAINER, GROUP, NAME_LABEL, PLURAL, VERSION, MiniCluster

EXIT_ERROR = 1
KUBECONFIG = "~/.kube/config"
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class PluginError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl mc", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="commands: submit (mc-submit), exec (any command), or any `mc` command")
    p.add_argument("-n", "--namespace", help="the MiniCluster's namespace (default: the context's)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--kubeconfig", help="kubeconfig file")
    p.add_argument("-i", "--stdin", action="store_true", help="pass stdin to the command")
    p.add_argument("command", help="submit, exec, or an mc command (run, jobs, attach, cancel, logs, ...)")
    p.add_argument("name", help="the MiniCluster")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the command")
    return p


def remote_argv(command: str, args: list[str], tools: str = "") -> list[str]:
    """What runs in the broker pod for `kubectl mc COMMAND NAME ARGS...`; `tools` is the directory of the pod's
    own `mc` (tools_dir), "" for the image's PATH."""
    if command == "exec":
        argv = args[1:] if args[:1] == ["--"] else args
        if not argv:
            raise PluginError("kubectl mc exec NAME -- COMMAND...: no command given")
        return argv
    if command == "submit":
        return [os.path.join(tools, "mc-submit"), *args]
    return [os.path.join(tools, "mc"), command, *args]


def tools_dir(pod: Mapping[str, Any]) -> str:
    """Where the pod's `mc` is: the injected runtime's bin/, which is not on the application image's PATH (exec
    runs with the image's environment), or "" when the pod runs a baked image's `mc` from its PATH."""
    command = next((c.get("command") or [""] for c in pod["spec"]["containers"] if c["name"] == CONTAINER), [""])
    return os.path.dirname(command[0])


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        remote_argv(args.command, list(args.args))  # a usage error before any API call
        api, namespace = _connect(args)
        pod = find_broker_pod(api, namespace, args.name)
        command = remote_argv(args.command, list(args.args), tools_dir(pod))
        return _exec(api, namespace, str(pod["metadata"]["name"]), command, args.stdin)
    except PluginError as exc:
        print(f"kubectl mc: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _connect(args: argparse.Namespace) -> tuple[Any, str]:
    """An API client and the namespace, from the kubeconfig as kubectl reads it, else the in-cluster account."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise PluginError("the kubernetes client is not installed: pip install 'minicluster[kubectl]'") from None

    path = args.kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or KUBECONFIG
    if args.kubeconfig or os.path.exists(os.path.expanduser(path)):
        try:
            config.load_kube_config(config_file=path, context=args.context)
            contexts, active = config.list_kube_config_contexts(config_file=path)
        except (config.ConfigException, OSError) as exc:
            raise PluginError(f"kubeconfig {path}: {exc}") from None
        chosen = next((c for c in contexts if c["name"] == args.context), {}) if args.context else active
        return client.ApiClient(), args.namespace or (chosen.get("context") or {}).get("namespace") or "default"
    try:
        config.load_incluster_config()
    except config.ConfigException:
        raise PluginError(f"no kubeconfig ({path}) and not in a cluster: set KUBECONFIG or pass --kubeconfig") from None
    return client.ApiClient(), args.namespace or _own_namespace()


def _own_namespace() -> str:
    try:
        with open(SA_NAMESPACE) as f:
            return f.read().strip()
    except OSError:
        return "default"


def find_broker_pod(api: Any, namespace: str, name: str) -> Mapping[str, Any]:
    """The running rank-0 pod of MiniCluster `name`, or a PluginError saying why there is none."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        body = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"{NAME_LABEL}={name}")
    except ApiException as exc:
        if exc.status == 404:
            raise PluginError(f"MiniCluster {name!r} not found in namespace {namespace!r}") from None
        raise PluginError(f"the API server refused: {exc.status} {exc.reason}") from None
    body = cast("dict[str, Any]", body)  # the client returns the parsed JSON object
    mc = MiniCluster.from_body(body)
    pod = pods_mod.broker_pod(mc, [api.sanitize_for_serialization(p) for p in pods.items])
    if pod is None:
        phase = (body.get("status") or {}).get("phase", "unknown")
        raise PluginError(f"MiniCluster {name!r} has no running broker pod (phase {phase}); "
                          f"`kubectl describe mc {name}` says why")
    return pod


def _exec(api: Any, namespace: str, pod: str, argv: list[str], with_stdin: bool) -> int:
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    from kubernetes.stream import stream

    core = client.CoreV1Api(api)
    try:
        ws = stream(core.connect_get_namespaced_pod_exec, pod, namespace, container=CONTAINER, command=argv,
                    stdin=with_stdin, stdout=True, stderr=True, tty=False, _preload_content=False, binary=True)
    except ApiException as exc:
        raise PluginError(f"cannot exec in pod {pod}: {exc.status} {exc.reason}") from None
    if with_stdin:
        threading.Thread(target=_pump_stdin, args=(ws,), daemon=True).start()
    while ws.is_open():
        ws.update(timeout=1)
        _copy(ws.read_stdout(), sys.stdout)
        _copy(ws.read_stderr(), sys.stderr)
    _copy(ws.read_stdout(), sys.stdout)
    _copy(ws.read_stderr(), sys.stderr)
    code = ws.returncode
    ws.close()
    ws.sock.shutdown()  # websocket-client's close() leaves the socket open when the server closed first
    return int(code) if code is not None else EXIT_ERROR


def _copy(data: bytes | str, out: Any) -> None:
    if data:
        out.buffer.write(data if isinstance(data, bytes) else data.encode())
        out.flush()


def _pump_stdin(ws: Any) -> None:
    while True:
        chunk = cast(io.BufferedReader, sys.stdin.buffer).read1(64 * 1024)
        if not chunk:
            return
        ws.write_stdin(chunk)


if __name__ == "__main__":
    sys.exit(main())
