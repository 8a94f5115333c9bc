#!/usr/bin/env bash
# Idempotent set-up of the Docker backend's engine on a Debian machine: install docker.io and
# debootstrap if missing, start dockerd if it is not answering, and build the offline base image
# termgym/base:bookworm if it is not there. Safe to run again: each step is skipped when done.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/apt-ensure.sh
apt_ensure docker-engine dockerd:docker.io debootstrap:debootstrap docker-registry:docker-registry

socket=/var/run/docker.sock
answering() { [ -S "$socket" ] && .venv/bin/python -c "import docker; docker.from_env(timeout=5).ping()" >/dev/null 2>&1; }
if ! answering; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "docker-engine: the Docker daemon is not running; start it (as root): dockerd --iptables=false --bridge=none &" >&2
    exit 1
  fi
  echo "docker-engine: starting dockerd (no bridge network: containers get network none)" >&2
  # The daemon is a service: it outlives this script, in its own session.
  setsid nohup dockerd --iptables=false --bridge=none >/var/log/termgym-dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 1 120); do answering && break; sleep 0.5; done
  answering || { echo "docker-engine: dockerd did not start; see /var/log/termgym-dockerd.log" >&2; exit 1; }
fi

.venv/bin/termgym images bootstrap
