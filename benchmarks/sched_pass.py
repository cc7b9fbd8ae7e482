"""One scheduling pass against the length of the queue, and one take of the queue's head against the number of
users (not a timed test).

    python benchmarks/sched_pass.py [--queued 2000,20000,200000] [--passes 2000] [--pass-users 5000]
                                    [--users 50,5000] [--takes 2000]
    python benchmarks/sched_pass.py --trees main=/path/to/main,new=. --runs 5   # interleaved, medians, ratios

Pass: 8 cores (4 ranks x 2) busy with one-core jobs, N more queued; each step releases one running job and
schedules, which starts the next: the broker's cycle for a stream of single jobs with the window off. A pass should
not cost more with a longer queue. The same with U users of 4 queued jobs each (U buckets; `--pass-users`).

Take: the same 8 busy cores, U users with 4 queued jobs each (U buckets); each step takes the head of the queue to
send ahead in the dispatch window (Scheduler.take_ahead_job) and queues it again behind the others. A take should
not cost more with more users.

Prints JSON: CPU microseconds per release + pass for each queue length, and per take for each number of users.
"""
from __future__ import annotations

import argparse
import json
import time

from broker import nodes, sched
from minicluster.config import from_mapping
from minicluster.testing.builders import resources


def busy_scheduler() -> sched.Scheduler:
    config = from_mapping({"state_dir": "/nonexistent", "size": 4, "resources": "cores=2"})
    graph, _ = nodes.build_graph(config)
    for rank in range(4):
        nodes.add_rank(graph, rank, resources("cores=2,memory=1024").to_wire(), frozenset())
    return sched.Scheduler(graph)


def per_pass(queued: int, passes: int, users: int = 1) -> float:
    scheduler = busy_scheduler()
    for i in range(queued + 8):
        scheduler.enqueue(sched.SchedJob(job_id=i + 1, submit_time=float(i), user=i % users))
    running = scheduler.schedule(0.0)
    start = time.process_time()
    for step in range(passes):
        ended = running[step % len(running)]
        scheduler.release(ended.job_id, ended.element, 1.0)
        running[step % len(running)] = scheduler.schedule(1.0)[0]
    return (time.process_time() - start) / passes * 1e6


def per_take(users: int, takes: int) -> float:
    scheduler = busy_scheduler()
    for i in range(8 + 4 * users):
        scheduler.enqueue(sched.SchedJob(job_id=i + 1, submit_time=float(i), user=i % users), 0.0)
    running = scheduler.schedule(0.0)
    after = running[0].job_id
    start = time.process_time()
    for step in range(takes):
        job = scheduler.take_ahead_job(lambda job_id: True, after)
        assert job is not None
        scheduler.drop_ahead(job.job_id)
        scheduler.enqueue(sched.SchedJob(job_id=job.job_id, submit_time=1e6 + step, user=job.user), 0.0)
    return (time.process_time() - start) / takes * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", default="2000,20000,200000")
    parser.add_argument("--passes", type=int, default=2000)
    parser.add_argument("--pass-users", default="5000")
    parser.add_argument("--users", default="50,5000")
    parser.add_argument("--takes", type=int, default=2000)
    parser.add_argument("--trees", help="name=DIR,name=DIR: checkouts to compare run by run, the first is the base")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.trees:
        import trees  # benchmarks/trees.py
        own = ["--queued", args.queued, "--passes", str(args.passes), "--pass-users", args.pass_users,
               "--users", args.users, "--takes", str(args.takes)]
        print(json.dumps(trees.interleave(trees.parse_trees(args.trees), args.runs,
                                          lambda name, i: [__file__, *own], json.loads), indent=1))
        return
    passes = {n: per_pass(int(n), args.passes) for n in args.queued.split(",") if n}
    user_passes = {u: per_pass(4 * int(u), args.passes, int(u)) for u in args.pass_users.split(",") if u}
    takes = {u: per_take(int(u), args.takes) for u in args.users.split(",") if u}
    print(json.dumps({"cpu_us_per_release_and_pass": {n: round(v, 1) for n, v in passes.items()},
                      "cpu_us_per_release_and_pass_by_users": {u: round(v, 1) for u, v in user_passes.items()},
                      "cpu_us_per_head_take": {u: round(v, 1) for u, v in takes.items()}}))


if __name__ == "__main__":
    main()
