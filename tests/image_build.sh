#!/usr/bin/env bash
# Build the triage image here, without Docker and without pulling python:3.11-slim-bookworm:
# a Debian bookworm root made with debootstrap stands in for the base (Debian's python3 3.11 in a
# venv, so `python` and its pip behave as in the official image), and buildah builds the
# repository's Dockerfile on it (storage driver vfs, isolation chroot). Needs root, buildah and
# debootstrap (apt-get install -y buildah debootstrap). tests/deploy/test_image.py drives it.
#
#   tests/image_build.sh base              the stand-in base, built once and then reused (cached)
#   tests/image_build.sh image [TAG]       base, then `buildah bud` of ./Dockerfile; prints the image id
#   tests/image_build.sh buildah ARGS...   buildah on the cache's storage, e.g. `... buildah images`
#   tests/image_build.sh clean             drop the cache (storage, rootfs tarball)
#
# Environment:
#   TRIAGE_IMAGE_CACHE   cache directory (default /var/tmp/triage-image-cache): buildah's vfs storage
#                        and the debootstrap tarball; its own storage, so the host's is never touched
#   TRIAGE_BASE_IMAGE    name of the stand-in base (default localhost/bookworm-python:3.11)
#   DEBIAN_MIRROR        Debian mirror (default: the one in this machine's apt sources, else
#                        http://deb.debian.org/debian)
#   TRIAGE_EXTRA_CA_DIR  extra trust anchors (*.crt) put into the base, for a TLS-intercepting egress
#                        proxy in front of PyPI (default /usr/local/share/ca-certificates, the host's)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${TRIAGE_IMAGE_CACHE:-/var/tmp/triage-image-cache}"
BASE_IMAGE="${TRIAGE_BASE_IMAGE:-localhost/bookworm-python:3.11}"
EXTRA_CA_DIR="${TRIAGE_EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"
SUITE=bookworm
# python3-venv: the venv the base's `python` lives in; ca-certificates, netbase, tzdata: what the
# official python:3.11-slim-bookworm carries besides Python
PACKAGES=python3,python3-venv,python3-pip,ca-certificates,netbase,tzdata
VENV=/opt/python
BASE_PATH="$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
# runroot (locks, mount state) on tmpfs when there is one, so a reboot cannot leave it stale; one per
# cache directory, as two storages must never share a runroot
RUNROOT="/run/triage-image-cache-$(printf %s "$CACHE" | sha256sum | cut -c1-12)"
[ -d /run ] && [ -w /run ] || RUNROOT="$CACHE/run"
BUILDAH=(buildah --root "$CACHE/storage" --runroot "$RUNROOT" --storage-driver vfs)

log() { printf '%s image_build: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    # the first Debian mirror in this machine's apt sources (deb822 `URIs:` or one-line `deb`)
    local found
    found=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | sed -nE 's/^URIs:[[:space:]]*(\S+).*/\1/p; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?(\S+)[[:space:]]+\S+[[:space:]]+.*main.*/\2/p' \
        | grep -E '/debian/?$' | head -n1 || true)
    echo "${found:-http://deb.debian.org/debian}"
}

extra_cas() { find "$EXTRA_CA_DIR" -maxdepth 1 -name '*.crt' -type f 2>/dev/null | sort; }

recipe() {
    # everything the base is made from: a change to any of it rebuilds the base
    printf 'suite=%s\npackages=%s\nmirror=%s\nvenv=%s\npath=%s\nrecipe=4\n' \
        "$SUITE" "$PACKAGES" "$(mirror)" "$VENV" "$BASE_PATH"
    local ca
    for ca in $(extra_cas); do sha256sum "$ca" | cut -d' ' -f1; done
}

base() {
    mkdir -p "$CACHE"
    exec 9>"$CACHE/base.lock"
    flock 9 # concurrent runs share the cache: one builds the base, the others wait and reuse it
    local key
    key=$(recipe | sha256sum | cut -c1-16)
    if [ "$("${BUILDAH[@]}" inspect --type image --format '{{index .ImageAnnotations "triage.base-recipe"}}' \
        "$BASE_IMAGE" 2>/dev/null || true)" = "$key" ]; then
        log "base $BASE_IMAGE is cached (recipe $key)"
        return
    fi
    local tarball="$CACHE/rootfs-$key.tar"
    if [ ! -s "$tarball" ]; then
        local mirror_url dir
        mirror_url=$(mirror)
        dir=$(mktemp -d "$CACHE/rootfs.XXXXXX")
        log "debootstrap $SUITE from $mirror_url into $dir"
        debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$dir" "$mirror_url" \
            >"$CACHE/debootstrap.log" 2>&1 || {
            tail -n 30 "$CACHE/debootstrap.log" >&2
            rm -rf "$dir"
            return 1
        }
        rm -f "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*_Packages
        tar -C "$dir" --numeric-owner -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
        rm -rf "$dir"
        find "$CACHE" -maxdepth 1 -name 'rootfs-*.tar' ! -name "rootfs-$key.tar" -delete
    fi
    log "importing $tarball as $BASE_IMAGE"
    local ctr mnt ca
    ctr=$("${BUILDAH[@]}" from --pull=never scratch)
    trap '"${BUILDAH[@]}" rm "$ctr" >/dev/null 2>&1 || true; trap - RETURN' RETURN
    mnt=$("${BUILDAH[@]}" mount "$ctr")
    tar -C "$mnt" --numeric-owner -xpf "$tarball"
    for ca in $(extra_cas); do
        install -m 0644 "$ca" "$mnt/usr/local/share/ca-certificates/$(basename "$ca")"
    done
    "${BUILDAH[@]}" umount "$ctr" >/dev/null
    "${BUILDAH[@]}" run "$ctr" -- update-ca-certificates >/dev/null
    # `python` and a pip it may use and uninstall, as in the official image (Debian's own python3
    # has no `python` and its pip refuses to install into it: PEP 668)
    "${BUILDAH[@]}" run "$ctr" -- python3 -m venv "$VENV"
    "${BUILDAH[@]}" config --env PATH="$BASE_PATH" --env LANG=C.UTF-8 --cmd python3 \
        --annotation "triage.base-recipe=$key" "$ctr"
    "${BUILDAH[@]}" commit --quiet --squash "$ctr" "$BASE_IMAGE" >/dev/null
    log "base $BASE_IMAGE built (recipe $key)"
}

image() {
    local tag="${1:-localhost/triage:test}"
    base
    log "buildah bud -t $tag (base $BASE_IMAGE)"
    cd "$ROOT"
    "${BUILDAH[@]}" bud --isolation chroot --pull=never --quiet \
        --build-arg "PYTHON_IMAGE=$BASE_IMAGE" -f Dockerfile -t "$tag" . >&2
    "${BUILDAH[@]}" inspect --type image --format '{{.FromImageID}}' "$tag"
}

case "${1:-}" in
base) base ;;
image) image "${2:-}" ;;
buildah)
    shift
    exec "${BUILDAH[@]}" "$@"
    ;;
clean)
    "${BUILDAH[@]}" rm --all >/dev/null 2>&1 || true
    rm -rf "$CACHE" "$RUNROOT" 2>/dev/null || {
        # vfs layers can hold immutable bits or busy mounts: unmount, then retry
        umount -R "$CACHE/storage" 2>/dev/null || true
        rm -rf "$CACHE" "$RUNROOT"
    }
    ;;
*)
    sed -n '2,20p' "$0" >&2
    exit 2
    ;;
esac
