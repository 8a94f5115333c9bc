#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: Debian packages the embedded sandbox needs, then .venv with
# the project installed. Safe to run again: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v nsenter >/dev/null 2>&1 || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: missing ${need_apt[*]}; run: sudo apt-get install -y ${need_apt[*]}" >&2
    exit 1
  fi
  echo "bootstrap: installing ${need_apt[*]} with apt-get" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
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
  .venv/bin/python -m pip install -q -e '.[test,train]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
