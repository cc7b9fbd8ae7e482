"""One scheduling pass against the length of the queue (not a timed test).

    python benchmarks/sched_pass.py [--queued 2000,20000,200000] [--passes 2000]
    PYTHONPATH=/path/to/other/checkout python benchmarks/sched_pass.py   # the same on another tree

8 cores (4 ranks x 2) busy with one-core jobs, N more queued; each step releases one running job and schedules,
which starts the next: the broker's cycle for a stream of single jobs with the window off. Prints JSON: CPU
microseconds per release + pass for each queue length. A pass should not cost more with a longer queue.
"""
from __future__ import annotations

import argparse
import json
import time

from broker import nodes, sched
from minicluster.config import from_mapping
from minicluster.testing.builders import resources


def per_pass(queued: int, passes: int) -> float:
    config = from_mapping({"state_dir": "/nonexistent", "size": 4, "resources": "cores=2"})
    graph, _ = nodes.build_graph(config)
    for rank in range(4):
        nodes.add_rank(graph, rank, resources("cores=2,memory=1024").to_wire(), frozenset())
    scheduler = sched.Scheduler(graph)
    for i in range(queued + 8):
        scheduler.enqueue(sched.SchedJob(job_id=i + 1, submit_time=float(i)))
    running = scheduler.schedule(0.0)
    start = time.process_time()
    for step in range(passes):
        ended = running[step % len(running)]
        scheduler.release(ended.job_id, ended.element, 1.0)
        running[step % len(running)] = scheduler.schedule(1.0)[0]
    return (time.process_time() - start) / passes * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", default="2000,20000,200000")
    parser.add_argument("--passes", type=int, default=2000)
    args = parser.parse_args()
    sizes = [int(n) for n in args.queued.split(",")]
    print(json.dumps({"cpu_us_per_release_and_pass": {str(n): round(per_pass(n, args.passes), 1) for n in sizes}}))


if __name__ == "__main__":
    main()
