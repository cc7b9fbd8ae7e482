"""Pod volumes laid out as the kubelet lays them out, modes and ownership included.

* configMap, secret, projected: the atomic writer's layout: a timestamped directory of files, `..data` pointing at
  it, and one symlink per top-level entry; files owned by root with the item's mode (or `defaultMode`, 0644).
* emptyDir: a directory of mode 0777 (with `medium: Memory` a tmpfs, mounted by the pod's init).
* persistentVolumeClaim: the bound PersistentVolume's directory.
* fsGroup: the kubelet's SetVolumeOwnership: every entry group-owned by fsGroup, read-only volumes get g+r, others
  g+rw, directories setgid and g+x.  This is what lets UID 10001 read a 0400 key that root owns.
"""
from __future__ import annotations

import base64
import datetime
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

DEFAULT_MODE = 0o644
READ_ONLY_KINDS = ("configMap", "secret", "projected", "downwardAPI")
Lookup = Callable[[str, str], Mapping[str, Any] | None]  # (kind, name) -> object in the pod's namespace


class VolumeError(Exception):
    """The kubelet would not start the pod (e.g. a missing ConfigMap): reported as the container waiting."""


def atomic_write(target: Path, files: Mapping[str, tuple[bytes, int]]) -> None:
    """`files`: relative path -> (content, mode).  The volume's own directory is an emptyDir (mode 0777)."""
    target.mkdir(parents=True, exist_ok=True)
    target.chmod(0o777)
    stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    payload = target / stamp
    payload.mkdir(mode=0o755)
    for rel, (content, mode) in files.items():
        path = payload / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        path.write_bytes(content)
        path.chmod(mode)
    (target / "..data").symlink_to(stamp)
    for top in sorted({rel.split("/", 1)[0] for rel in files}):
        (target / top).symlink_to(f"..data/{top}")


def set_ownership(root: Path, fs_group: int, read_only: bool) -> None:
    """The kubelet's SetVolumeOwnership over `root`, itself included."""
    mask = 0o440 if read_only else 0o660
    for path in [root, *root.rglob("*")]:
        info = path.lstat()
        os.lchown(path, -1, fs_group)
        if stat.S_ISLNK(info.st_mode):
            continue
        extra = mask | (stat.S_ISGID | 0o110 if stat.S_ISDIR(info.st_mode) else 0)
        path.chmod(stat.S_IMODE(info.st_mode) | extra)


def _items(data: Mapping[str, bytes], items: list[Mapping[str, Any]] | None, default_mode: int,
           source: str) -> dict[str, tuple[bytes, int]]:
    if not items:
        return {key: (value, default_mode) for key, value in data.items()}
    out = {}
    for item in items:
        if item["key"] not in data:
            raise VolumeError(f'{source}: key "{item["key"]}" not found')
        out[item["path"]] = (data[item["key"]], int(item.get("mode", default_mode)))
    return out


def _config_map_data(obj: Mapping[str, Any]) -> dict[str, bytes]:
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _secret_data(obj: Mapping[str, Any]) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


def _source_files(kind: str, source: Mapping[str, Any], default_mode: int,
                  lookup: Lookup) -> dict[str, tuple[bytes, int]]:
    name = source.get("name") or source.get("secretName", "")
    obj = lookup("ConfigMap" if kind == "configMap" else "Secret", name)
    if obj is None:
        if source.get("optional"):
            return {}
        raise VolumeError(f'{kind} "{name}" not found')
    data = _config_map_data(obj) if kind == "configMap" else _secret_data(obj)
    return _items(data, source.get("items"), default_mode, f'{kind} "{name}"')


def lay_out(volume: Mapping[str, Any], where: Path, lookup: Lookup,
            claim_dir: Callable[[str], Path]) -> tuple[Path, str]:
    """Prepare one pod volume under `where`; (host path to mount, kind).  Memory emptyDirs are mounted by the
    pod's init, which gets the kind "tmpfs"."""
    name = volume["name"]
    target = where / name
    if "emptyDir" in volume:
        target.mkdir(parents=True)
        target.chmod(0o777)
        return target, "tmpfs" if (volume["emptyDir"] or {}).get("medium") == "Memory" else "emptyDir"
    if "configMap" in volume or "secret" in volume:
        kind = "configMap" if "configMap" in volume else "secret"
        mode = int(volume[kind].get("defaultMode", DEFAULT_MODE))
        atomic_write(target, _source_files(kind, volume[kind], mode, lookup))
        return target, kind
    if "projected" in volume:
        mode = int(volume["projected"].get("defaultMode", DEFAULT_MODE))
        files: dict[str, tuple[bytes, int]] = {}
        for source in volume["projected"].get("sources") or []:
            for kind in ("configMap", "secret"):
                if kind in source:
                    files.update(_source_files(kind, source[kind], mode, lookup))
        atomic_write(target, files)
        return target, "projected"
    if "persistentVolumeClaim" in volume:
        return claim_dir(volume["persistentVolumeClaim"]["claimName"]), "persistentVolumeClaim"
    raise VolumeError(f"volume {name!r}: type {sorted(set(volume) - {'name'})} is not emulated by the e2e node")
