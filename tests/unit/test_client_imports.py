"""`mc-submit` (and `mc submit`) is run once per job from shell loops: what its start-up imports is pinned here.

Every call pays Python's start-up and these imports (issue 17 item 6; benchmarks/startup.py measures the loop).
A fresh interpreter imports the submit path, parses typical options and builds the wire jobspec, and must not
have loaded the heavy modules: the event loop, ZeroMQ, rich, the config and jobspec models and what they pull in.
mc-submit itself (a plain line: options it parses without argparse, workflow options too) must not even load
argparse, re, socket.py, msgpack or what they pull in (enum, collections, datetime): on this machine they were
most of its start-up.
tests/integration/test_cli.py::test_mc_submit_script_imports runs the installed script against an instance.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig

import minicluster

# Measured against what the interpreter had already loaded before (site, and an editable install's path finder,
# import some of these themselves).
SUBMIT_PATH = """
import json, sys
before = set(sys.modules)
import minicluster.cli.main  # `mc submit` goes through it
from minicluster.cli.submit import _parser
from minicluster.cli.options import command_of, jobspec_from_args, parse_job_args
args = parse_job_args(_parser("mc-submit", "", run=False),
                      ["-n", "2", "-t", "10m", "--mem", "1G", "--env", "A=1", "--cc", "0-3", "--", "echo", "{cc}"])
spec = jobspec_from_args(args, command_of(args), check=False)
assert spec["array"] == "0-3" and spec["time_limit"] == 600.0, spec
print(json.dumps(sorted(set(sys.modules) - before)))
"""

HEAVY = ("asyncio", "zmq", "rich", "tomllib", "dataclasses", "inspect", "pathlib", "urllib", "sqlite3", "subprocess",
         "threading", "ipaddress", "typing", "shutil", "minicluster.config", "minicluster.model.jobspec",
         "minicluster.model.workflow", "minicluster.model.restree", "minicluster.model.sharing",
         "minicluster.cli.watch", "minicluster.cli.format", "importlib.metadata", "email", "zipfile")

# mc-submit's own path: what the `mc-submit` script runs for a plain line, up to the bytes it sends and the
# answer it reads.  Run with -S (no site, so no .pth path finder of an editable install loads re and pathlib
# first) and the checkout and site-packages on PYTHONPATH: everything it imports is counted.
MC_SUBMIT_PATH = """
import sys
before = set(sys.modules)
from minicluster.cli.submit import _submit_args
from minicluster.cli.options import command_of, jobspec_from_args
from minicluster.proto import frames
args = _submit_args(["-n", "2", "--mem", "1G", "--env", "A=1", "--cc", "0-3", "--urgency", "20", "--hold",
                     "-t", "1:00:00", "-d", "afterok:1", "--on-exit", "2=fail", "--on-signal", "9=retry",
                     "--retry-delay", "10m", "--begin-time", "+10m", "--", "echo", "{cc}"], "mc-submit")
spec = jobspec_from_args(args, command_of(args), check=False)
assert spec["array"] == "0-3" and spec["ntasks"] == 2 and spec["hold"] and spec["env"]["A"] == "1", spec
assert spec["dependencies"] == [{"type": "afterok", "jobs": [1]}] and spec["retry_delay"] == 600.0, spec
assert len(frames.pack_request({"v": 1, "id": 1, "op": "submit", "jobspec": spec})) > 100
answer = frames.pack_request({"v": 1, "id": 1, "ok": True, "job": 7})
class Sock:
    def recv(self, n, data=[answer]):
        chunk, data[0] = data[0][:n], data[0][n:]
        return chunk
assert frames.read_blocking(Sock()) == {"v": 1, "id": 1, "ok": True, "job": 7}
print(repr(sorted(set(sys.modules) - before)))
"""

# On mc-submit's path on top of HEAVY: these were two thirds of its imports (issue 17 item 6), and the workflow
# options' parsers imported re, datetime and signal (enum).
NOT_ON_MC_SUBMIT = ("argparse", "re", "socket", "selectors", "enum", "functools", "collections", "msgpack",
                    "datetime", "gettext", "signal", "select", "minicluster.cli.argparser", "minicluster.cli.main")


def _heavy(loaded: list[str], heavy: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if m in heavy or m.split(".")[0] in heavy)


def test_submit_path_imports_nothing_heavy() -> None:
    out = subprocess.run([sys.executable, "-c", SUBMIT_PATH], capture_output=True, text=True, timeout=60, check=True)
    loaded = json_list(out.stdout)
    assert "minicluster.cli.submit" in loaded
    assert _heavy(loaded, HEAVY) == [], f"the submit path now imports {_heavy(loaded, HEAVY)}"


def test_mc_submit_path_imports_no_argparse_socket_or_msgpack() -> None:
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(minicluster.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([checkout, sysconfig.get_paths()["purelib"]]))
    out = subprocess.run([sys.executable, "-S", "-c", MC_SUBMIT_PATH], capture_output=True, text=True, timeout=60,
                         env=env, cwd=checkout)
    assert out.returncode == 0, out.stderr
    loaded = ast.literal_eval(out.stdout)
    assert "minicluster.cli.submit" in loaded and "minicluster.proto.smallpack" in loaded
    heavy = _heavy(loaded, HEAVY + NOT_ON_MC_SUBMIT)
    assert heavy == [], f"mc-submit now imports {heavy}"


def json_list(text: str) -> list[str]:
    import json

    value = json.loads(text)
    assert isinstance(value, list)
    return value
