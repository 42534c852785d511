#!/usr/bin/env bash
# Run a command inside an image's filesystem as the image would run in a restricted pod,
# without a container runtime (`podman run` cannot set rlimits on our machines): the image
# mounted read-only (`podman image mount`), a fresh tmpfs at /tmp (the Deployment's emptyDir),
# /proc and /dev from the host, and the image's own USER, WORKDIR and ENV, in a private mount
# namespace that vanishes with the command. The network is the host's (loopback is enough
# for `muster demo`).
#
#   hack/image/run-in-image.sh localhost/muster:dev muster demo
#   podman image unmount localhost/muster:dev      # when done
#
# Needs root, podman, unshare and chroot (util-linux, coreutils).
set -euo pipefail

IMAGE=${1:?usage: run-in-image.sh IMAGE COMMAND [ARGS...]}
shift
(($#)) || { echo "usage: run-in-image.sh IMAGE COMMAND [ARGS...]" >&2; exit 2; }

mnt=$(podman image mount "$IMAGE")
user=$(podman image inspect --format '{{.Config.User}}' "$IMAGE")
workdir=$(podman image inspect --format '{{.Config.WorkingDir}}' "$IMAGE")
mapfile -t env < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' \
    "$IMAGE" | sed '/^$/d')

# shellcheck disable=SC2016 # expanded by the inner shell
exec unshare --mount --propagation private /bin/bash -c '
    set -euo pipefail
    mnt=$1 user=$2 workdir=$3 n=$4
    shift 4
    env=("${@:1:n}")
    shift "$n"
    mount -t tmpfs -o mode=1777,size=256m tmpfs "$mnt/tmp"
    mount -t proc proc "$mnt/proc"
    mount --rbind /dev "$mnt/dev"
    exec chroot --userspec="${user:-0:0}" "$mnt" /usr/bin/env -i "${env[@]}" \
        /bin/sh -c "cd \"\$0\" && exec \"\$@\"" "${workdir:-/}" "$@"
' run-in-image "$mnt" "$user" "$workdir" "${#env[@]}" "${env[@]}" "$@"
