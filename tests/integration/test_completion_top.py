"""Shell completion through real bash and zsh, and `mc top`, against a real instance (test_cli's)."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from minicluster.testing import LocalCluster
from tests.integration.test_cli import instance, mc, wait_state  # noqa: F401  (module fixture)


def bash_complete(line: str) -> list[str]:
    """What TAB offers in bash after typing `line`, with the script `mc completion bash` prints."""
    script = ('source <(mc completion bash)\n'
              'COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}\n'
              'read -ra COMP_WORDS <<< "$COMP_LINE"; COMP_CWORD=${#COMP_WORDS[@]}\n'
              '_mc_complete\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    out = subprocess.run(["bash", "-c", script, "bash", line], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [w for w in out.stdout.splitlines() if w]


def test_bash_completes_subcommands_options_values_and_job_ids() -> None:
    assert bash_complete("mc can") == ["cancel"]
    assert set(bash_complete("mc ")) >= {"run", "submit", "jobs", "top", "completion", "--version"}
    assert "--label" in bash_complete("mc run --l") and "--ntasks" in bash_complete("mc run --n")
    assert bash_complete("mc run --policy s") == ["spread"]
    assert bash_complete("mc run --policy=") == ["first-fit", "pack", "spread", "low-id", "high-id",
                                                  "locality-first"]
    assert bash_complete("mc-submit --mp") == ["--mpi"]
    assert bash_complete("mc run sleep --") == []  # the command's own arguments: left to the shell
    running = int(mc("submit", "sleep", "30").stdout)
    finished = int(mc("submit", "--wait", "true").stdout)
    try:
        wait_state(running, "RUN")
        assert str(running) in bash_complete("mc cancel ")
        assert str(finished) not in bash_complete("mc cancel ")  # only active jobs can be cancelled
        assert {str(running), str(finished)} <= set(bash_complete("mc logs "))
    finally:
        mc("cancel", str(running))


@pytest.mark.needs("zsh")
def test_zsh_script_offers_the_same() -> None:
    # compadd and _files are zsh's completion builtins; outside a completion widget they are stood in for.
    script = ('compadd() { shift ${@[(i)--]}; print -l -- "$@" }\n'
              '_files() { print FILES }\n'
              'source <(mc completion zsh)\n'
              'words=("$@"); CURRENT=$#\n'
              '_mc\n')

    def zsh_complete(*words: str) -> list[str]:
        out = subprocess.run(["zsh", "-f", "-c", script, "zsh", *words], capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert zsh_complete("mc", "can") == ["cancel"]
    assert zsh_complete("mc", "run", "--policy=s") == ["--policy=spread"]
    assert zsh_complete("mc", "run", "--cwd", "") == ["FILES"]


def test_top_shows_queue_rates_ranks_and_busiest_jobs() -> None:
    busy = int(mc("submit", "-n", "3", "--mpi", "none", "sleep", "30").stdout)
    try:
        wait_state(busy, "RUN")
        out = subprocess.run(["mc", "top", "-n", "2", "-d", "0.3"], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "COLUMNS": "200"})
        assert out.returncode == 0, out.stderr
        frames = out.stdout.split("jobs by state")
        assert len(frames) == 3
        last = out.stdout[out.stdout.rindex("tasks/s"):]
        assert re.match(r"tasks/s: \d+\.\d started, \d+\.\d ended", last)
        queue = last.splitlines()[2:4]
        assert queue[0].split()[:4] == ["DEPEND", "PRIORITY", "SCHED", "RUN"] and int(queue[1].split()[3]) >= 1
        assert [line.split()[:3] for line in last.splitlines() if re.match(r"\s+\d\s+\S+\s+up", line)] == \
            [["0", os.uname().nodename, "up"], ["1", os.uname().nodename, "up"], ["2", os.uname().nodename, "up"]]
        row = next(line for line in last.splitlines() if line.split()[:1] == [str(busy)])
        assert row.split()[3:5] == ["RUN", "3"]
    finally:
        mc("cancel", str(busy))
    bad = mc("top", "-d", "0")
    assert bad.returncode == 2 and bad.stderr.startswith("mc top: error: --delay must be a number of seconds above 0")


def test_top_names_nodes_as_resources_does(tmp_path: Path) -> None:
    """With a resource graph file the nodes have the graph's names: `mc top` shows those, like `mc resources`,
    not the host the ranks' processes run on."""
    from broker.sched import ResourceGraph, jgf

    site = ResourceGraph(())
    for rank in range(2):
        site.add_rank(rank, hostname=f"gpunode{rank}", sockets={0: (0,)})
    graph = tmp_path / "site.jgf"
    graph.write_text(json.dumps(jgf.dump(site)))
    with LocalCluster(tmp_path / "state", size=2, resources="cores=1", resource_graph=str(graph)) as cluster:
        env = {**os.environ, "MC_URI": cluster.uri, "COLUMNS": "200"}
        views = {}
        for argv in (["resources"], ["top", "-n", "1"]):
            out = subprocess.run(["mc", *argv], capture_output=True, text=True, timeout=30, env=env)
            assert out.returncode == 0, out.stderr
            views[argv[0]] = [line.split()[:2] for line in out.stdout.splitlines()
                              if re.match(r"\s*\d\s+\S+\s+up\b", line)]
        assert views["resources"] == views["top"] == [["0", "gpunode0"], ["1", "gpunode1"]]
