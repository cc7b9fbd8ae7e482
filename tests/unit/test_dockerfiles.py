"""The images' users and groups against what their Debian base image already has (issue 25, item 1).

Every python:*-bookworm image is built on debian:bookworm-slim, whose base-passwd ships fixed users and groups
(group `operator`, gid 37, among them): a useradd or groupadd that takes one of their names or ids fails the
build (`useradd: group operator exists`, exit 9).  Checked against this machine's base-passwd masters, the files
base-passwd builds /etc/passwd and /etc/group from, so no container runtime is needed; as root, the Dockerfiles'
useradd and groupadd commands also run for real on a copy of them (`--prefix`).
"""
from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted(REPO.glob("images/*/Dockerfile"))
MASTERS = Path("/usr/share/base-passwd")


@dataclass(frozen=True)
class Account:
    kind: str  # "user" or "group"
    name: str
    id: int | None  # None: the tool picks one


def _masters(name: str) -> dict[str, int]:
    path = MASTERS / name
    if not path.exists():
        pytest.skip(f"{path} is missing: base-passwd is not installed (not a Debian machine)")
    return {line.split(":")[0]: int(line.split(":")[2]) for line in path.read_text().splitlines() if line}


def _commands(dockerfile: Path) -> list[list[str]]:
    """Each shell command of the file's RUN instructions, as words (continuations joined, split at && and ;)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    commands: list[list[str]] = []
    for line in text.splitlines():
        if line.strip().upper().startswith("RUN "):
            words: list[str] = []
            for word in [*shlex.split(line.strip()[4:]), "&&"]:
                if word in ("&&", ";", "||"):
                    commands.append(words)
                    words = []
                else:
                    words.append(word)
    return [c for c in commands if c]


def _option(words: list[str], *names: str) -> str | None:
    for i, word in enumerate(words):
        for name in names:
            if word == name and i + 1 < len(words):
                return words[i + 1]
            if name.startswith("--") and word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def accounts(dockerfile: Path) -> list[Account]:
    """The users and groups the file's useradd and groupadd create (a useradd without -g/-N makes the user's
    own group, named after it)."""
    made: list[Account] = []
    for words in _commands(dockerfile):
        if words[0] == "groupadd":
            gid = _option(words, "--gid", "-g")
            made.append(Account("group", words[-1], int(gid) if gid else None))
        elif words[0] == "useradd":
            uid = _option(words, "--uid", "-u")
            made.append(Account("user", words[-1], int(uid) if uid else None))
            if _option(words, "--gid", "-g") is None and not {"--no-user-group", "-N"} & set(words):
                made.append(Account("group", words[-1], int(uid) if uid else None))  # its gid: the uid if free
    return made


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_no_user_or_group_clashes_with_debians_base_passwd(dockerfile: Path) -> None:
    shipped = {"user": _masters("passwd.master"), "group": _masters("group.master")}
    made = accounts(dockerfile)
    assert made, f"{dockerfile}: no useradd found (the images run as an unprivileged user)"
    for account in made:
        taken = shipped[account.kind]
        assert account.name not in taken, f"{dockerfile}: {account.kind} {account.name} exists in the base image"
        assert account.id not in taken.values(), f"{dockerfile}: {account.kind} id {account.id} is taken"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_user_instruction_names_the_ids_created(dockerfile: Path) -> None:
    """USER uid:gid must be the user and the group the file creates, by id (the pods' runAsUser/Group)."""
    user = [line.split()[1] for line in dockerfile.read_text().splitlines() if line.startswith("USER ")][-1]
    uid, gid = (int(part) for part in user.split(":"))
    made = accounts(dockerfile)
    assert any(a.kind == "user" and a.id == uid for a in made), f"{dockerfile}: no user with uid {uid}"
    assert any(a.kind == "group" and a.id == gid for a in made), f"{dockerfile}: no group with gid {gid}"


def test_commands_are_parsed_across_continuations(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM x\nRUN groupadd --gid 7 g \\\n    && useradd --uid=8 -g 7 u ; true\n"
                          "RUN useradd operator\n")
    assert accounts(dockerfile) == [Account("group", "g", 7), Account("user", "u", 8),
                                    Account("user", "operator", None), Account("group", "operator", None)]


@pytest.mark.slow  # runs useradd and groupadd
@pytest.mark.needs("useradd", "groupadd", root=True)
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_user_commands_succeed_on_a_copy_of_debians_base_passwd(dockerfile: Path, tmp_path: Path) -> None:
    """The file's groupadd and useradd commands, run with --prefix on an /etc made from base-passwd's masters, as
    in a fresh python:*-bookworm image; then USER's uid and gid exist there."""
    _masters("group.master")  # skips without base-passwd
    etc = tmp_path / "etc"
    etc.mkdir()
    shutil.copy(MASTERS / "passwd.master", etc / "passwd")
    shutil.copy(MASTERS / "group.master", etc / "group")
    for name in ("shadow", "gshadow"):
        (etc / name).touch(mode=0o640)
    if Path("/etc/login.defs").exists():
        shutil.copy("/etc/login.defs", etc / "login.defs")
    for words in _commands(dockerfile):
        if words[0] in ("groupadd", "useradd"):
            done = subprocess.run([words[0], "--prefix", str(tmp_path), *words[1:]], capture_output=True, text=True,
                                  timeout=30)
            assert done.returncode == 0, f"{shlex.join(words)}: {done.stderr.strip()} (exit {done.returncode})"
    user = [line.split()[1] for line in dockerfile.read_text().splitlines() if line.startswith("USER ")][-1]
    uid, gid = user.split(":")
    assert any(line.split(":")[2:4] == [uid, gid] for line in (etc / "passwd").read_text().splitlines())
    assert any(line.split(":")[2] == gid for line in (etc / "group").read_text().splitlines())
