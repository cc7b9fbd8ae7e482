"""Whole lines on the worker (worker/lines.py) and labelled lines at the client (minicluster/cli/output.py)."""
from __future__ import annotations

import asyncio
import io

from minicluster.cli.output import OutputWriter, task_labels
from worker.jobenv import accelerator_env
from worker.lines import LineBuffers


def collect() -> tuple[list[tuple[tuple[int, int], str, bytes]], LineBuffers]:
    sent: list[tuple[tuple[int, int], str, bytes]] = []
    return sent, LineBuffers(lambda key, stream, data: sent.append((key, stream, data)), wait=0.05, limit=16)


async def test_pieces_of_lines_leave_as_whole_lines() -> None:
    sent, lines = collect()
    a, b = (1, 0), (1, 1)
    lines.feed(a, "stdout", b"rank=0 si")
    lines.feed(b, "stdout", b"rank=1 size=2\nrank=1 ")
    lines.feed(a, "stdout", b"ze=2\n")
    lines.feed(a, "stderr", b"warn\n")
    assert sent == [(b, "stdout", b"rank=1 size=2\n"), (a, "stdout", b"rank=0 size=2\n"), (a, "stderr", b"warn\n")]
    lines.flush(b)
    assert sent[-1] == (b, "stdout", b"rank=1 ")
    lines.close()


async def test_a_partial_line_leaves_after_the_wait_and_past_the_size_bound() -> None:
    sent, lines = collect()
    lines.feed((2, 0), "stdout", b"Password: ")
    assert sent == []
    await asyncio.sleep(0.15)
    assert sent == [((2, 0), "stdout", b"Password: ")]
    lines.feed((2, 0), "stdout", b"x" * 20)
    assert sent[-1] == ((2, 0), "stdout", b"x" * 20)
    lines.feed((2, 0), "stdout", b"abc")
    lines.feed((2, 0), "stdout", b"def\nghi")
    assert sent[-1] == ((2, 0), "stdout", b"abcdef\n")
    lines.flush((2, 0))
    assert sent[-1] == ((2, 0), "stdout", b"ghi") and len(sent) == 4
    lines.close()


def write_all(label: bool, chunks: list[tuple[int, int, bytes]], array: str | None = None) -> tuple[str, str]:
    out, err = io.BytesIO(), io.BytesIO()
    writer = OutputWriter(out, err, task_labels(array) if label else None)  # type: ignore[arg-type]
    for task, stream, data in chunks:
        writer.write(task, stream, data)
    return out.getvalue().decode(), err.getvalue().decode()


def test_labels_prefix_every_line_with_its_task() -> None:
    chunks = [(0, 1, b"a\nb\n"), (1, 1, b"c\n"), (1, 2, b"oops\n")]
    assert write_all(True, chunks) == ("0: a\n0: b\n1: c\n", "1: oops\n")
    assert write_all(False, chunks) == ("a\nb\nc\n", "oops\n")
    assert write_all(True, [(0, 1, b"x\n"), (1, 1, b"y\n")], array="5,9") == ("5: x\n9: y\n", "")


def test_a_line_in_pieces_keeps_one_label_unless_another_task_cut_in() -> None:
    assert write_all(True, [(0, 1, b"Pass"), (0, 1, b"word: ok\n")]) == ("0: Password: ok\n", "")
    # Task 1's line comes between the pieces: task 0's line is ended, and its rest labelled again.
    assert write_all(True, [(0, 1, b"Pass"), (1, 1, b"hi\n"), (0, 1, b"word\n")]) == (
        "0: Pass\n1: hi\n0: word\n", "")


def test_accelerators_follow_the_allocation_not_the_submitter() -> None:
    mine = {"CUDA_VISIBLE_DEVICES": "3", "ZE_AFFINITY_MASK": "0.1", "PATH": "/bin"}
    none = accelerator_env(mine, ())
    assert none == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "-1", "ROCR_VISIBLE_DEVICES": "-1",
                    "HIP_VISIBLE_DEVICES": "-1"}
    two = accelerator_env(mine, (0, 2))
    assert {two[k] for k in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                             "GPU_DEVICE_ORDINAL", "ZE_AFFINITY_MASK")} == {"0,2"}
    assert mine["CUDA_VISIBLE_DEVICES"] == "3"
