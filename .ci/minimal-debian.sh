#!/usr/bin/env bash
# The README's test command in a minimal Debian (issue 31): what a new user with `python:3.11-slim` or a bare
# Debian has, not what .ci/run installs on this host.  Root.
#
# The root is the real-node tier's base (.ci/realnode.sh rootfs: debootstrap --variant=minbase bookworm with
# python3.11, python3-venv, python3-pip, ca-certificates, netbase and tzdata, and the host's extra CAs trusted), seen
# through an overlay so the cached root is never changed.  A clean clone of this checkout's HEAD goes in /src, and
# the README's test command runs there verbatim, with an empty environment (no CI: a test whose host tool is missing
# skips with the reason, as it would for that user).
#
# Everything runs in new mount and PID namespaces: the mounts vanish and every process the run left is killed
# when it ends, whatever happens.  The run's log is on stdout; the exit status is pytest's.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
log() { echo "minimal-debian.sh: $*" >&2; }
die() { echo "minimal-debian.sh: error: $*" >&2; exit 1; }
[[ ${EUID} -eq 0 ]] || die "run as root"

# The README's command, read from the README itself so the two cannot drift apart.
COMMAND="$(grep -m1 -E "^python3 -m venv .* pip install -e '\.\[test\]' && pytest$" "${REPO}/README.md")" \
    || die "no test command (python3 -m venv ... && pytest) in README.md"

BASE="$(bash "${REPO}/.ci/realnode.sh" rootfs)"
WORK="$(mktemp -d /var/tmp/mc-minimal-debian.XXXXXX)"
trap 'rm -rf "${WORK}"' EXIT
mkdir -p "${WORK}"/{upper,work,root,tmp}
git clone -q "${REPO}" "${WORK}/src"
log "base ${BASE}; clone of $(git -C "${WORK}/src" rev-parse --short HEAD); running: ${COMMAND}"

# shellcheck disable=SC2016
unshare --mount --pid --fork --kill-child --propagation private -- bash -euo pipefail -c '
    base="$1" work="$2" command="$3"
    root="${work}/root"
    mount -t overlay overlay -o "lowerdir=${base},upperdir=${work}/upper,workdir=${work}/work" "${root}"
    mkdir -p "${root}/src" "${root}/var/tmp"
    mount --bind "${work}/src" "${root}/src"
    mount -t proc proc "${root}/proc"
    mount --rbind /sys "${root}/sys"
    mount --rbind /dev "${root}/dev"
    mount -t tmpfs -o mode=1777,size=1g shm "${root}/dev/shm"
    mount --bind "${work}/tmp" "${root}/tmp" && chmod 1777 "${root}/tmp"
    mount -t tmpfs -o mode=755 run "${root}/run"
    cp -L /etc/resolv.conf "${root}/etc/resolv.conf"
    exec chroot "${root}" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        sh -c "cd /src && ${command}"
' minimal "${BASE}" "${WORK}" "${COMMAND}"
