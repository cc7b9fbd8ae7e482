"""`mc-submit` (and `mc submit`) is run once per job from shell loops: what its start-up imports is pinned here.

Every call pays Python's start-up and these imports (issue 17 item 6; benchmarks/startup.py measures the loop).
A fresh interpreter imports the submit path, parses typical options and builds the wire jobspec, and must not
have loaded the heavy modules: the event loop, ZeroMQ, rich, the config and jobspec models and what they pull in.
"""
from __future__ import annotations

import json
import subprocess
import sys

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


def test_submit_path_imports_nothing_heavy() -> None:
    out = subprocess.run([sys.executable, "-c", SUBMIT_PATH], capture_output=True, text=True, timeout=60, check=True)
    loaded = json.loads(out.stdout)
    assert "minicluster.cli.submit" in loaded and "msgpack" in loaded
    heavy = sorted(m for m in loaded if m in HEAVY or m.split(".")[0] in HEAVY)
    assert heavy == [], f"the submit path now imports {heavy}"
