#!/usr/bin/env bash
# The base layer of Muster's image, built from Debian packages where no image registry is
# reachable: a minimal Debian bookworm root filesystem with its Python 3.11 (python3,
# python3-venv) and CA certificates, written as a tar that `podman import` turns into an
# image. The Dockerfile's PYTHON_IMAGE build argument then points at that image instead of
# the public python:3.11-slim-bookworm.
#
#   hack/image/base.sh OUT.tar
#
# hack/build-image.sh calls this and caches the tar under a key that is the SHA-256 of this
# file's commands (comment lines aside): change the recipe below and the key (so the cache)
# changes with it. Needs root,
# debootstrap and a Debian mirror (DEBIAN_MIRROR, default deb.debian.org).
set -euo pipefail

OUT=${1:?usage: base.sh OUT.tar}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
# python3-venv brings ensurepip's wheels (the image's virtual environment needs pip once,
# at build time); ca-certificates for HTTPS to the API server's and clouds' endpoints.
PACKAGES=python3,python3-venv,ca-certificates

step() { printf 'muster-image: %s\n' "$*" >&2; }

root=$(mktemp -d "${TMPDIR:-/tmp}/muster-base.XXXXXX")
cleanup() {
    # Whatever debootstrap left mounted goes first, then the tree.
    for m in proc sys dev/pts dev; do
        umount -l "$root/$m" 2>/dev/null || true
    done
    rm -rf "$root"
}
trap cleanup EXIT

step "debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >&2

# Security and point-release updates, as the public Debian images carry them.
step "applying $SUITE security and point-release updates"
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
SOURCES
cp /etc/resolv.conf "$root/etc/resolv.conf"
chroot "$root" apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get -y -qq upgrade >&2
# shellcheck disable=SC2016 # dpkg-query's own format, not the shell's
chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' >"$OUT.packages"

step "trimming apt lists, caches, docs and man pages"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/locale/* "$root"/tmp/* "$root"/root/.cache
: >"$root/etc/resolv.conf"
# /tmp must stay world-writable with the sticky bit: the image's user writes only there.
chmod 1777 "$root/tmp"

step "writing $OUT"
tar --numeric-owner --xattrs -C "$root" -cf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
