"""The accelerator part of a task's environment (protocol.md §2.5): which GPUs the task may see.

The submitter's own values describe its node, not the worker's, and a task without GPUs must not wander onto
the GPUs other jobs hold: every variable below is replaced. CUDA and ROCm treat an invalid ordinal (`-1`) as
"no device"; Level Zero's mask and OpenCL's ordinal have no such value, so they are only removed.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

# Variables that name the devices a task may use, per runtime: CUDA, ROCm (ROCr, HIP), OpenCL on AMD, Level Zero.
GPU_LIST_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
                 "ZE_AFFINITY_MASK")
NO_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
NO_DEVICE = "-1"


def accelerator_env(env: Mapping[str, str], gpus: Sequence[int]) -> dict[str, str]:
    """A copy of `env` whose accelerator variables name exactly `gpus` (none: no device)."""
    out = {k: v for k, v in env.items() if k not in GPU_LIST_VARS}
    if gpus:
        ids = ",".join(map(str, gpus))
        out.update(dict.fromkeys(GPU_LIST_VARS, ids))
    else:
        out.update(dict.fromkeys(NO_DEVICE_VARS, NO_DEVICE))
    return out
