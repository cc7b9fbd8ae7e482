"""Writing a job's output on the user's terminal: stdout to stdout, stderr to stderr, optionally labelled.

Workers forward whole lines (worker/lines.py), so lines of different tasks never share a line here. With
`-l/--label` each line starts with its task's rank (`3: ...`, as `srun -l` and `flux run -l` print it), or for
an array with its index. A task's line that was forwarded in pieces (a prompt, an over-long line) is
continued without a second label, unless another task's line came in between: then the unfinished line is
ended first, and the rest gets its label again.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO

from minicluster.model.idset import IdSet


def task_labels(array: str | None) -> Callable[[int], bytes]:
    """Label of task `task`: its rank, or for an array job the array index of element `task`."""
    if array is None:
        return lambda task: f"{task}: ".encode()
    ids = IdSet.parse(array)
    return lambda task: f"{ids[task]}: ".encode()


class OutputWriter:
    def __init__(self, stdout: BinaryIO, stderr: BinaryIO, label: Callable[[int], bytes] | None = None) -> None:
        self._files = {1: stdout, 2: stderr}
        self._label = label
        # stream -> the task whose line is unfinished at the end of what we wrote there.
        self._open: dict[int, int | None] = {1: None, 2: None}

    def write(self, task: int, stream: int, data: bytes) -> None:
        out = self._files[2 if stream == 2 else 1]
        if self._label is not None and data:
            data = self._labelled(task, 2 if stream == 2 else 1, data)
        out.write(data)
        out.flush()

    def _labelled(self, task: int, stream: int, data: bytes) -> bytes:
        prefix = self._label(task) if self._label is not None else b""
        open_task = self._open[stream]
        body = data.replace(b"\n", b"\n" + prefix)
        if data.endswith(b"\n"):
            body = body[:-len(prefix)] if prefix else body
            self._open[stream] = None
        else:
            self._open[stream] = task
        if open_task == task:
            return body
        return (b"\n" if open_task is not None else b"") + prefix + body
