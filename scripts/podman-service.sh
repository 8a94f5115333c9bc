#!/usr/bin/env bash
# Idempotent set-up of Podman's Docker-compatible API for `--backend docker` on a Debian machine,
# rootful, or rootless as another user: install podman (Debian's) and catatonit (the init Podman
# puts into containers) if missing, start `podman system service` on a unix socket if nothing
# answers there, and put the offline base image termgym/base:bookworm into Podman's storage if it
# is not there (copied from the Docker engine when it has it, else built with debootstrap through
# Podman's API). Safe to run again: each step is skipped when done. Prints the DOCKER_HOST to use
# on its last line.
#
#   TERMGYM_PODMAN_SOCKET   the socket (default /run/termgym-podman/podman.sock); the service's
#                           pid and log go beside it (podman.pid, podman.log)
#   TERMGYM_PODMAN_STORAGE  a directory for a storage of its own (root/ and run/ under it);
#                           default Podman's own (/var/lib/containers/storage, or the user's)
#   TERMGYM_PODMAN_USER     rootless: the service runs as this user (made, with a range of
#                           subordinate ids, if it does not exist; its runtime directory beside the
#                           socket), with the kernel's own overlay where it allows one unprivileged
#
# Stop the service with: kill "$(cat /run/termgym-podman/podman.pid)" (rootless: and the user's
# pause process, which holds its user namespace: kill "$(cat DIR/runtime/libpod/tmp/pause.pid)")
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/apt-ensure.sh
apt_ensure podman-service podman:podman /usr/libexec/podman/catatonit:catatonit debootstrap:debootstrap

socket=${TERMGYM_PODMAN_SOCKET:-/run/termgym-podman/podman.sock}
dir=$(dirname "$socket")
user=${TERMGYM_PODMAN_USER:-}
as_user=()
if [ -n "$user" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "podman-service: making a rootless service for $user needs root" >&2; exit 1; }
  apt_ensure podman-service newuidmap:uidmap
  id "$user" >/dev/null 2>&1 || useradd --system --create-home --shell /usr/sbin/nologin "$user"
  for ids in /etc/subuid /etc/subgid; do  # 65536 subordinate ids after every range already given
    touch "$ids"
    grep -q "^$user:" "$ids" || awk -F: -v u="$user" 'BEGIN { n = 100000 }
      $3 && $2 + $3 > n { n = $2 + $3 } END { print u ":" n ":65536" }' "$ids" >>"$ids"
  done
  mkdir -p "$dir/runtime"
  chown "$user:" "$dir" "$dir/runtime"
  chmod 700 "$dir/runtime"
  as_user=(runuser -u "$user" -- env "HOME=$(getent passwd "$user" | cut -d: -f6)" "XDG_RUNTIME_DIR=$dir/runtime")
fi
podman=("${as_user[@]}" podman)
if [ -n "${TERMGYM_PODMAN_STORAGE:-}" ]; then
  mkdir -p "$TERMGYM_PODMAN_STORAGE"
  [ -z "$user" ] || chown "$user:" "$TERMGYM_PODMAN_STORAGE"
  podman+=(--root "$TERMGYM_PODMAN_STORAGE/root" --runroot "$TERMGYM_PODMAN_STORAGE/run")
fi
if [ -n "$user" ] && "${podman[@]}" --storage-driver overlay info >/dev/null 2>&1; then
  podman+=(--storage-driver overlay)  # else Podman's choice for the user: vfs, a copy per container
fi
export DOCKER_HOST="unix://$socket"

answering() { [ -S "$socket" ] && .venv/bin/python -c "import docker; docker.from_env(timeout=5).ping()" >/dev/null 2>&1; }
if ! answering; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "podman-service: not root; start it yourself: podman system service --time=0 unix://$socket &" >&2
    exit 1
  fi
  mkdir -p "$dir"
  [ -z "$user" ] || chown "$user:" "$dir"
  rm -f "$socket"
  echo "podman-service: starting podman system service on $socket" >&2
  # The service outlives this script, in its own session; --time=0: it never exits for being idle.
  setsid nohup "${podman[@]}" system service --time=0 "unix://$socket" >"$dir/podman.log" 2>&1 </dev/null &
  echo $! >"$dir/podman.pid"
  for _ in $(seq 1 120); do answering && break; sleep 0.25; done
  answering || { echo "podman-service: the service did not start; see $dir/podman.log" >&2; exit 1; }
fi

base=termgym/base:bookworm
if ! "${podman[@]}" image exists "$base"; then
  if DOCKER_HOST=unix:///var/run/docker.sock .venv/bin/python -c \
    "import docker; docker.from_env(timeout=5).api.inspect_image('$base')" >/dev/null 2>&1; then
    echo "podman-service: copying $base from the Docker engine" >&2
    if [ -n "$user" ]; then  # the user cannot reach the engine's socket: the image through a pipe
      DOCKER_HOST=unix:///var/run/docker.sock docker save "$base" | "${podman[@]}" load -q >/dev/null
    else
      "${podman[@]}" pull -q "docker-daemon:$base" >/dev/null
    fi
  else
    .venv/bin/termgym images bootstrap
  fi
fi
echo "DOCKER_HOST=$DOCKER_HOST"
