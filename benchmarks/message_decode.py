"""What typed overlay messages cost on the hot path (minicluster/proto/messages.py): µs per row or per job.

    python benchmarks/message_decode.py [--json] [--rows N]

done    rank 0 decodes a `done` of N result rows (a worker's flush at scale).
run     a worker decodes a `run` of N array tasks of one job, and a `run` of N single-task jobs (each with its
        jobinfo: 20 environment variables, the size of a small job's), as the 20k-jobs control benchmark sends.
encode  rank 0 builds and encodes the `run` of N single-task jobs (JobInfo dataclasses to a body).

Bodies are decoded from msgpack first, as the overlay hands them over; only the typed decode is timed.
Best of 5 repeats of timeit, divided by N.
"""
from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minicluster.proto import messages

ENV = {f"VAR_{i}": "x" * 20 for i in range(20)}


def _jobinfo() -> messages.JobInfo:
    return messages.JobInfo(["true"], dict(ENV), 1, [[1, 1]], 1000, 1000)


def _wire(body: dict[str, Any]) -> dict[str, Any]:
    value = msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False, strict_map_key=False)
    assert isinstance(value, dict)
    return value


def _per_item(fn: Any, n: int) -> float:
    return min(timeit.repeat(fn, number=1, repeat=5)) / n * 1e6


def measure(n: int) -> dict[str, float]:
    done = _wire({"results": [[1, i, 0, 0, None, None, 1.0, 2.0, 0] for i in range(n)]})
    array_run = _wire(messages.to_body(messages.Run({1: _jobinfo()}, [[1, i, i, [i % 64], []] for i in range(n)])))
    jobs_run_message = messages.Run({j: _jobinfo() for j in range(n)}, [[j, 0, 0, [j % 64], []] for j in range(n)])
    jobs_run = _wire(messages.to_body(jobs_run_message))
    return {
        "rows": n,
        "done_decode_us_per_row": _per_item(lambda: messages.decode("done", done), n),
        "run_array_decode_us_per_task": _per_item(lambda: messages.decode_order("run", array_run), n),
        "run_jobs_decode_us_per_job": _per_item(lambda: messages.decode_order("run", jobs_run), n),
        "run_jobs_encode_us_per_job": _per_item(lambda: messages.to_body(messages.Run(
            {j: _jobinfo() for j in range(n)}, jobs_run_message.tasks)), n),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--rows", type=int, default=10_000, help="rows, tasks or jobs per message")
    args = parser.parse_args()
    result = measure(args.rows)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, value in result.items():
            print(f"{name:32} {value:10.3f}" if isinstance(value, float) else f"{name:32} {value:10}")


if __name__ == "__main__":
    main()
