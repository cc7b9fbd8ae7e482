#!/usr/bin/env bash
# Build (once) and cache Kubernetes 1.20.2 binaries: kube-apiserver, kube-controller-manager and etcd for the
# operator's `apiserver` tier, and, named as arguments, more of them (the real-node tier asks for kubelet,
# kube-scheduler, kube-proxy and kubectl):  bash .ci/kubernetes.sh [kubelet kube-scheduler ...]
#
# Idempotent: when the cached binaries exist this only prints their directory.
# The binaries live outside the repo so every checkout and CI run can reuse them;
# tests find them via MC_K8S_BIN (default: the directory printed here).
#
# Why build from source: only PyPI, npm and Debian are reachable. Debian
# bookworm ships the Kubernetes 1.20.2 *source* (with vendor/), which Debian's
# Go compiles in a few minutes.
set -euo pipefail

K8S_VERSION="v1.20.2"
CACHE="${MC_K8S_CACHE:-/var/cache/minicluster/k8s-${K8S_VERSION}}"
BIN="${CACHE}/bin"
WANTED=(kube-apiserver kube-controller-manager etcd "$@")
for b in "$@"; do
    case "${b}" in
        kubelet|kube-scheduler|kube-proxy|kubectl) ;;
        *) echo "kubernetes.sh: unknown binary ${b}" >&2; exit 2 ;;
    esac
done

have_all() {
    local b
    for b in "${WANTED[@]}"; do [[ -x "${BIN}/${b}" ]] || return 1; done
}

if have_all; then
    echo "${BIN}"
    exit 0
fi

log() { echo "kubernetes.sh: $*" >&2; }
export DEBIAN_FRONTEND=noninteractive

# `apt-get source` needs a deb-src entry; add one next to the distro's list.
SRC_LIST=/etc/apt/sources.list.d/minicluster-deb-src.sources
if ! grep -rqs '^Types:.*deb-src\|^deb-src' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding ${SRC_LIST}"
    cat >"${SRC_LIST}" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi

log "installing build dependencies"
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends \
    golang-go rsync dpkg-dev etcd-server golang-github-modern-go-reflect2-dev >&2

mkdir -p "${CACHE}/src" "${BIN}"
cd "${CACHE}/src"
if ! ls -d kubernetes-*/ >/dev/null 2>&1; then
    log "fetching the Debian kubernetes source package"
    apt-get source -qq kubernetes >&2
fi
SRCDIR="$(ls -d "${CACHE}"/src/kubernetes-*/ | head -n1)"

# The vendored reflect2 1.0.1 crashes under Go >= 1.18 on the first
# custom-resource create; Debian's 1.0.2 is API-compatible and fixes it.
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2
REFLECT2_DST="${SRCDIR}/vendor/github.com/modern-go/reflect2"
rsync -a --delete --exclude='*_test.go' "${REFLECT2_SRC}/" "${REFLECT2_DST}/"

TARGETS=()
for b in "${WANTED[@]}"; do
    [[ "${b}" == etcd || -x "${BIN}/${b}" ]] || TARGETS+=("cmd/${b}")
done
log "building ${TARGETS[*]} (several minutes each; the kubelet about ten)"
cd "${SRCDIR}"
export GOFLAGS=-mod=vendor GOPROXY=off GO111MODULE=on
export KUBE_GIT_VERSION="${K8S_VERSION}" KUBE_GIT_TREE_STATE=clean
export KUBE_GIT_COMMIT=0000000000000000000000000000000000000000
make WHAT="${TARGETS[*]}" >&2

for target in "${TARGETS[@]}"; do
    install -m 0755 "_output/bin/${target#cmd/}" "${BIN}/${target#cmd/}"
done
ln -sf "$(command -v etcd)" "${BIN}/etcd"

have_all
log "binaries cached in ${BIN}"
echo "${BIN}"
