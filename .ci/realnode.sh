#!/usr/bin/env bash
# Host preparation for the real-node tier (issue 25): the container tools and the three images its kubelet runs,
# built without Docker and without a registry.  Root; idempotent; every product lives outside the checkout in
# ${MC_REALNODE_CACHE:-/var/cache/minicluster/realnode}.
#
#   .ci/realnode.sh [build]       prepare everything; prints "IMAGE<TAB>ARCHIVE" per image on stdout
#   .ci/realnode.sh import SOCK   import the archives into the containerd at SOCK (namespace k8s.io), skipping
#                                 those it already holds
#   .ci/realnode.sh rootfs        make only the base's root directory (step 3's debootstrap, host CAs trusted)
#                                 and print its path: the minimal Debian of .ci/minimal-debian.sh
#
# Steps of `build`, each skipped when its product is current:
#   1. packages: Debian's containerd, runc, CNI plugins, buildah, debootstrap, and what the kubelet and
#      kube-proxy call (iptables, conntrack); only the missing ones are installed.
#   2. pause: the Kubernetes source's pause.c (${MC_K8S_CACHE}/src, fetched by .ci/kubernetes.sh), linked
#      statically, in a FROM-scratch image named as Debian's containerd names its default sandbox image, so
#      the tier's containerd needs no sandbox_image setting.
#   3. base: a stand-in for the Dockerfiles' FROM (python:*-slim-bookworm), made with debootstrap (minbase) from
#      this machine's Debian mirror, with Debian's Python, pip made usable system-wide as in the official image,
#      and the host's extra CA certificates (a TLS-intercepting proxy) trusted.  Checked, when it is made, to
#      offer every command the Dockerfiles' RUN lines call and to reach PyPI.
#   4. runtime, operator: `buildah bud` of images/*/Dockerfile with the repository as context, tagged as
#      examples/ and deploy/ name them; rebuilt when the Dockerfile, a file it copies or the base changes, and
#      exported again only when the image id changed.
#   5. application images without minicluster (app-mpi, app-old, app-static, app-nomnt): their root directories
#      from tests/e2e/appimages.py (Debian's archive, cached and keyed by recipe), each copied into a
#      FROM-scratch container with its USER, CMD, WORKDIR and ENV, committed as minicluster.test/NAME:N and
#      exported; rebuilt when the root's key changes.  MiniClusters inject the runtime into them.
# Buildah's storage is in the cache too (storage/); the archives and images.json are in images/.
set -euo pipefail
shopt -s nullglob

REPO="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${MC_REALNODE_CACHE:-/var/cache/minicluster/realnode}"
K8S_CACHE="${MC_K8S_CACHE:-/var/cache/minicluster/k8s-v1.20.2}"
OUT="${CACHE}/images"
MANIFEST="${OUT}/images.json"
BASE_SUITE=bookworm
BASE_PACKAGES=python3.11,python3-venv,python3-pip,ca-certificates,netbase,tzdata
HOST_CA_DIR=/usr/local/share/ca-certificates
# Command -> Debian package, for step 1.  conntrack and iptables(-save/-restore) are kube-proxy's; the
# kubelet's own KUBE-MARK chains need iptables.  mount, nsenter and find are already in any Debian.
declare -A WANTED=(
    [containerd]=containerd [runc]=runc [/usr/lib/cni/bridge]=containernetworking-plugins
    [buildah]=buildah [debootstrap]=debootstrap [iptables]=iptables [conntrack]=conntrack
    [update-ca-certificates]=ca-certificates [gcc]=gcc [/usr/lib/x86_64-linux-gnu/libc.a]=libc6-dev
    [mount]=mount [nsenter]=util-linux [find]=findutils
)

log() { echo "realnode.sh: $*" >&2; }
die() { echo "realnode.sh: error: $*" >&2; exit 1; }
# Buildah's storage is this cache's own; its run state goes in /run, one directory per cache.
RUNROOT="/run/minicluster-realnode/$(printf %s "${CACHE}" | sha256sum | cut -c1-12)"
bah() { buildah --root "${CACHE}/storage" --runroot "${RUNROOT}" "$@"; }
timed() {  # NAME CMD...: run CMD, log its wall time
    local name="$1" t0=${SECONDS}; shift
    "$@"
    log "${name}: $((SECONDS - t0)) s"
}
image_id() { bah images --noheading --no-trunc --format '{{.ID}}' "$1" 2>/dev/null | head -n1 || true; }  # "" if none

# --- images.json: {name: {image, archive, id, config}} (id: buildah's; config: the archive's config digest) ---
manifest_get() {  # NAME FIELD
    python3 - "${MANIFEST}" "$1" "$2" <<'PY'
import json, sys
try:
    print(json.load(open(sys.argv[1])).get(sys.argv[2], {}).get(sys.argv[3], ""))
except FileNotFoundError:
    print("")
PY
}
manifest_put() {  # NAME IMAGE ARCHIVE ID
    python3 - "${MANIFEST}" "$@" <<'PY'
import json, os, sys, tarfile
path, name, image, archive, image_id = sys.argv[1:]
with tarfile.open(archive) as tar:
    config = json.load(tar.extractfile("manifest.json"))[0]["Config"]
entries = json.load(open(path)) if os.path.exists(path) else {}
entries[name] = {"image": image, "archive": archive, "id": image_id, "config": "sha256:" + config.removesuffix(".json")}
with open(path + ".tmp", "w") as f:
    json.dump(entries, f, indent=2, sort_keys=True)
os.replace(path + ".tmp", path)
PY
}
export_archive() {  # NAME IMAGE: write the docker-archive unless the one there is of this very image
    local name="$1" image="$2" id archive="${OUT}/$1.tar"
    id="$(image_id "${image}")"
    [[ -n "${id}" ]] || die "${image} is not in buildah's storage"
    if [[ -f "${archive}" && "$(manifest_get "${name}" id)" == "${id}" ]]; then return 0; fi
    rm -f "${archive}.tmp"
    bah push --quiet "${image}" "docker-archive:${archive}.tmp:${image}" >&2
    mv "${archive}.tmp" "${archive}"
    manifest_put "${name}" "${image}" "${archive}" "${id}"
    log "${name}: ${image} -> ${archive} ($(du -h "${archive}" | cut -f1))"
}

# --- 1. packages ---
install_packages() {
    local want=() path
    for path in "${!WANTED[@]}"; do
        if [[ "${path}" == /* ]]; then [[ -e "${path}" ]] && continue; else command -v "${path}" >/dev/null && continue; fi
        want+=("${WANTED[${path}]}")
    done
    [[ ${#want[@]} -eq 0 ]] && return 0
    log "installing ${want[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${want[@]}" >&2
}

# --- 2. pause ---
pause_image_name() {  # the sandbox image Debian's containerd uses when its config names none
    containerd config default | sed -n 's/^ *sandbox_image = "\(.*\)"$/\1/p' | head -n1
}
build_pause() {
    local image="$1" sources=("${K8S_CACHE}"/src/kubernetes-*/build/pause/linux/pause.c) src work="${CACHE}/pause" key
    [[ ${#sources[@]} -gt 0 ]] \
        || die "no pause.c under ${K8S_CACHE}/src: fetch the Kubernetes source first (.ci/kubernetes.sh does)"
    src="${sources[0]}"
    key="$(cat "${src}" <(echo "${image}") | sha256sum | cut -c1-64)"
    if [[ -n "$(image_id "${image}")" && "$(cat "${work}/key" 2>/dev/null)" == "${key}" ]]; then return 0; fi
    mkdir -p "${work}"
    gcc -Os -Wall -static -DVERSION="minicluster-stand-in" -o "${work}/pause" "${src}"
    strip "${work}/pause"
    local c
    c="$(bah from scratch)"
    bah copy "${c}" "${work}/pause" /pause >/dev/null
    bah config --entrypoint '["/pause"]' --user 65535:65535 "${c}"
    bah commit --quiet --rm "${c}" "${image}" >/dev/null
    echo "${key}" >"${work}/key"
}

# --- 3. base ---
from_image() {  # the FROM of a Dockerfile, fully qualified as buildah resolves a short name
    local from
    from="$(awk 'toupper($1) == "FROM" {print $2; exit}' "$1")"
    case "${from}" in
        */*/*) echo "${from}" ;;
        */*) echo "docker.io/${from}" ;;
        *) echo "docker.io/library/${from}" ;;
    esac
}
debian_mirror() {  # the Debian archive this machine's apt takes the base's suite from
    apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(ORIGIN)' 'Created-By: Packages' \
        | awk -v suite="${BASE_SUITE}" '$2 == suite && $3 == "Debian" {print $1; exit}'
}
build_rootfs() {
    local root="${CACHE}/base/rootfs" key mirror
    mirror="$(debian_mirror)"
    [[ -n "${mirror}" ]] || die "no Debian mirror in /etc/apt/sources.list*"
    key="${BASE_SUITE} ${BASE_PACKAGES} ${mirror}"
    [[ "$(cat "${CACHE}/base/rootfs.key" 2>/dev/null)" == "${key}" ]] && return 0
    rm -rf "${root}" "${CACHE}/base/rootfs.key"
    mkdir -p "${root}"
    log "debootstrap ${BASE_SUITE} from ${mirror}"
    debootstrap --variant=minbase --include="${BASE_PACKAGES}" "${BASE_SUITE}" "${root}" "${mirror}" >&2
    # As in the official image: python and pip on /usr/local/bin, pip free to install system-wide (no PEP 668).
    local name
    for name in python python3; do ln -sf /usr/bin/python3 "${root}/usr/local/bin/${name}"; done
    for name in pip pip3; do ln -sf /usr/bin/pip3 "${root}/usr/local/bin/${name}"; done
    rm -f "${root}"/usr/lib/python3*/EXTERNALLY-MANAGED
    rm -rf "${root}"/var/cache/apt/archives/*.deb "${root}"/var/lib/apt/lists/* "${root}"/usr/share/doc/* \
        "${root}"/usr/share/man/*
    echo "${key}" >"${CACHE}/base/rootfs.key"
}
trust_host_cas() {  # the image trusts exactly the host's extra CAs
    local root="${CACHE}/base/rootfs"
    rm -f "${root}${HOST_CA_DIR}"/*.crt
    if compgen -G "${HOST_CA_DIR}/*.crt" >/dev/null; then
        cp "${HOST_CA_DIR}"/*.crt "${root}${HOST_CA_DIR}/"
        log "trusting the host's extra CAs: $(cd "${HOST_CA_DIR}" && echo *.crt)"
    fi
    chroot "${root}" update-ca-certificates --fresh >/dev/null 2>&1
}
run_commands() {  # DOCKERFILE...: the first word of every shell command in their RUN lines
    awk '
        toupper($1) == "RUN" && $2 !~ /^\[/ { run = 1; sub(/^[ \t]*[Rr][Uu][Nn][ \t]+/, "") }
        run { line = $0; more = sub(/\\[ \t]*$/, "", line); printf "%s ", line; if (!more) { print ""; run = 0 } }
    ' "$@" | sed -E 's/(&&|\|\||;|\|)/\n/g' | awk '{for (i = 1; i <= NF; i++) if ($i !~ /=/) {print $i; break}}' \
        | sort -u
}
check_base() {  # IMAGE PYTHON_MINOR: the stand-in offers what the Dockerfiles use, and pip reaches PyPI
    local image="$1" minor="$2" c missing version
    c="$(bah from --pull=never "${image}")"
    # shellcheck disable=SC2046
    missing="$(bah run --network none "${c}" -- sh -c 'for x do command -v "$x" >/dev/null || echo "$x"; done' sh \
        $(run_commands "${REPO}"/images/*/Dockerfile) python "python${minor}")"
    version="$(bah run --network none "${c}" -- python --version 2>&1 || true)"
    local probe=ok
    bah run --network host "${c}" -- pip download --quiet --no-deps --no-cache-dir -d /tmp/probe packaging \
        >&2 || probe=failed
    bah rm "${c}" >/dev/null
    [[ -z "${missing}" ]] || die "the base stand-in ${image} lacks what the Dockerfiles call: ${missing//$'\n'/ }"
    [[ "${version}" == "Python ${minor}."* ]] || die "the base stand-in ${image} has ${version}, not Python ${minor}"
    [[ "${probe}" == ok ]] || die "pip in the base stand-in ${image} cannot download from PyPI (a CA missing?)"
    log "base: ${image} is ${version} and offers $(run_commands "${REPO}"/images/*/Dockerfile | tr '\n' ' ')"
}
build_base() {
    local image="$1" root="${CACHE}/base/rootfs" key minor c mnt
    timed debootstrap build_rootfs
    key="$(cat "${CACHE}/base/rootfs.key" <(echo "${image}") "${HOST_CA_DIR}"/*.crt 2>/dev/null | sha256sum | cut -c1-64)"
    if [[ -n "$(image_id "${image}")" && "$(cat "${CACHE}/base/image.key" 2>/dev/null)" == "${key}" ]]; then return 0; fi
    trust_host_cas
    # buildah 1.28 has no `import`: copy the tree into a FROM-scratch container and commit that.
    c="$(bah from scratch)"
    mnt="$(bah mount "${c}")"
    tar -C "${root}" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . \
        | tar -C "${mnt}" --numeric-owner -x
    bah umount "${c}" >/dev/null
    bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
        --cmd python3 "${c}"
    bah commit --quiet --rm "${c}" "${image}" >/dev/null
    minor="$(sed -E 's|.*/python:([0-9]+\.[0-9]+).*|\1|' <<<"${image}")"
    check_base "${image}" "${minor}"
    echo "${key}" >"${CACHE}/base/image.key"
}

# --- 4. the project's images ---
context_key() {  # DOCKERFILE BASE: a hash of the Dockerfile, every file its COPY lines take, and the base image
    local dockerfile="$1" base="$2"
    {
        sha256sum "${dockerfile}"
        image_id "${base}"
        cd "${REPO}"
        awk 'toupper($1) == "COPY" {for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i}' "${dockerfile}" \
            | while read -r src; do
                find "${src}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum
            done
    } | sha256sum | cut -c1-64
}
build_project_image() {  # NAME IMAGE BASE
    local name="$1" image="$2" base="$3" dockerfile="${REPO}/images/$1/Dockerfile" key keyfile="${OUT}/$1.key"
    key="$(context_key "${dockerfile}" "${base}")"
    if [[ -n "$(image_id "${image}")" && "$(cat "${keyfile}" 2>/dev/null)" == "${key}" ]]; then return 0; fi
    # --network host: RUN pip uses the host's resolver (and its proxy, whose CA the base trusts).
    bah bud --quiet --pull=never --network host --layers -f "${dockerfile}" -t "${image}" "${REPO}" >&2
    check_image "${image}" "${PROBE_ARG[$1]}"
    [[ "$1" != runtime ]] || check_view "${image}"
    # Drop the chains of earlier builds; the layers of every tagged image stay (the cache of the next build).
    bah rmi --prune >/dev/null
    echo "${key}" >"${keyfile}"
}
declare -A PROBE_ARG=([runtime]=--version [operator]=--help)  # an argument the entrypoint answers and exits 0 to
check_image() {  # IMAGE ARG: the entrypoint runs, as the image's USER, and answers ARG
    local image="$1" arg="$2" c user uid entrypoint=()
    user="$(bah inspect --type image --format '{{.OCIv1.Config.User}}' "${image}")"
    mapfile -t entrypoint < <(bah inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}' \
        "${image}")
    [[ ${#entrypoint[@]} -gt 0 ]] || die "${image} has no entrypoint"
    c="$(bah from --pull=never "${image}")"
    uid="$(bah run --network none "${c}" -- id -u)"
    bah run --network none "${c}" -- "${entrypoint[@]}" "${arg}" >/dev/null || {
        bah rm "${c}" >/dev/null
        die "${image}: its entrypoint ${entrypoint[*]} ${arg} failed"
    }
    bah rm "${c}" >/dev/null
    [[ "${uid}" == "${user%%:*}" ]] || die "${image}: runs as uid ${uid}, not its USER ${user}"
    log "${image}: ${entrypoint[*]} ${arg} runs as uid ${uid}"
}
check_view() {  # IMAGE: the injected runtime it carries runs by itself, with no PATH, as the image's USER
    local image="$1" c version
    c="$(bah from --pull=never "${image}")"
    version="$(bah run --network none --env PATH= "${c}" -- /mnt/minicluster/bin/mc --version)" || {
        bah rm "${c}" >/dev/null
        die "${image}: its injected runtime's /mnt/minicluster/bin/mc --version failed"
    }
    bah rm "${c}" >/dev/null
    log "${image}: /mnt/minicluster/bin/mc --version says ${version}"
}
project_image() {  # NAME: the tag examples/ (runtime) and deploy/ (operator) use, checked against both
    local version repo="ghcr.io/minicluster/$1"
    version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "${REPO}/pyproject.toml" | head -n1)"
    case "$1" in
        runtime) grep -rqF "image: ${repo}:${version}" "${REPO}/examples" ;;
        operator) grep -qF "newName: ${repo}" "${REPO}/deploy/kustomization.yaml" \
            && grep -qF "newTag: \"${version}\"" "${REPO}/deploy/kustomization.yaml" ;;
    esac || die "${repo}:${version} is not the $1 image examples/ and deploy/ name"
    echo "${repo}:${version}"
}

# --- 5. application images ---
APP_IMAGES=(app-mpi app-old app-static app-nomnt)
app_fields() {  # LISTING NAME: its image, key and root, then one `buildah config` argument a line
    python3 - "$1" "$2" <<'PY'
import json, sys
entry = json.loads(sys.argv[1])[sys.argv[2]]
config = entry["config"]
lines = [entry["image"], entry["key"], entry["root"], "--user", config["User"], "--cmd", json.dumps(config["Cmd"]),
         "--workingdir", config["WorkingDir"]]
if config["Entrypoint"]:
    lines += ["--entrypoint", json.dumps(config["Entrypoint"])]
for env in config["Env"]:
    lines += ["--env", env]
print("\n".join(lines))
PY
}
build_app_image() {  # LISTING NAME
    local fields image key root c mnt keyfile="${OUT}/$2.key"
    mapfile -t fields < <(app_fields "$1" "$2")
    image="${fields[0]}" key="${fields[1]}" root="${fields[2]}"
    if [[ -n "$(image_id "${image}")" && "$(cat "${keyfile}" 2>/dev/null)" == "${key}" ]]; then return 0; fi
    c="$(bah from scratch)"
    mnt="$(bah mount "${c}")"
    tar -C "${root}" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . \
        | tar -C "${mnt}" --numeric-owner -x
    bah umount "${c}" >/dev/null
    bah config "${fields[@]:3}" "${c}"
    bah commit --quiet --rm "${c}" "${image}" >/dev/null
    echo "${key}" >"${keyfile}"
}

rootfs() {
    mkdir -p "${CACHE}/base"
    exec 9>"${CACHE}/lock"
    flock 9
    command -v debootstrap >/dev/null || { apt-get update -qq >&2; apt-get install -y -qq debootstrap >&2; }
    timed debootstrap build_rootfs
    trust_host_cas
    echo "${CACHE}/base/rootfs"
}
build() {
    mkdir -p "${OUT}" "${RUNROOT}"
    exec 9>"${CACHE}/lock"
    flock 9
    timed packages install_packages
    local pause base name image
    pause="$(pause_image_name)"
    [[ -n "${pause}" ]] || die "containerd config default names no sandbox_image"
    timed pause build_pause "${pause}"
    timed "pause export" export_archive pause "${pause}"
    base="$(from_image "${REPO}/images/runtime/Dockerfile")"
    [[ "$(from_image "${REPO}/images/operator/Dockerfile")" == "${base}" ]] \
        || die "images/runtime and images/operator start FROM different images; the stand-in makes one"
    timed base build_base "${base}"
    for name in runtime operator; do
        image="$(project_image "${name}")"
        timed "${name}" build_project_image "${name}" "${image}" "${base}"
        timed "${name} export" export_archive "${name}" "${image}"
    done
    local listing
    listing="$(timed "application roots" python3 "${REPO}/tests/e2e/appimages.py" "${APP_IMAGES[@]}")"
    for name in "${APP_IMAGES[@]}"; do
        timed "${name}" build_app_image "${listing}" "${name}"
        timed "${name} export" export_archive "${name}" "$(app_fields "${listing}" "${name}" | sed -n 1p)"
    done
    log "images: ${MANIFEST}"
    python3 -c 'import json, sys; [print(e["image"], e["archive"], sep="\t") for e in json.load(open(sys.argv[1])).values()]' \
        "${MANIFEST}"
}

import_archives() {  # SOCKET: import each archive whose image containerd lacks or holds in another version
    local sock="$1" name image archive config held
    [[ -f "${MANIFEST}" ]] || die "no ${MANIFEST}: run .ci/realnode.sh first"
    for name in $(python3 -c 'import json, sys; print(*json.load(open(sys.argv[1])))' "${MANIFEST}"); do
        image="$(manifest_get "${name}" image)" archive="$(manifest_get "${name}" archive)"
        config="$(manifest_get "${name}" config)"
        held="$(ctr -a "${sock}" -n k8s.io images ls "name==${image}" 2>/dev/null | awk 'NR == 2 {print $3}')"
        if [[ -n "${held}" ]] && ctr -a "${sock}" -n k8s.io content get "${held}" \
                | python3 -c 'import json, sys; sys.exit(json.load(sys.stdin)["config"]["digest"] != sys.argv[1])' \
                    "${config}"; then
            continue
        fi
        ctr -a "${sock}" -n k8s.io images import "${archive}" >&2
        log "imported ${image}"
    done
}

[[ ${EUID} -eq 0 ]] || die "run as root"
case "${1:-build}" in
    build) build ;;
    import) import_archives "${2:?usage: realnode.sh import SOCKET}" ;;
    rootfs) rootfs ;;
    *) die "usage: realnode.sh [build] | import SOCKET | rootfs" ;;
esac
