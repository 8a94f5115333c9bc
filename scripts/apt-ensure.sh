# Sourced by the set-up scripts. apt_ensure WHO COMMAND:PACKAGE...: install, with apt-get, the
# Debian package of every COMMAND that is not on PATH; a no-op when all are there. Not root: one
# line saying what to install, and exit 1.
apt_ensure() {
  local who=$1 pair missing=()
  shift
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "$who: missing ${missing[*]}; run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "$who: installing ${missing[*]} with apt-get" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}
