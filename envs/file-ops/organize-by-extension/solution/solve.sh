#!/bin/bash
set -euo pipefail
cd /app/inbox
for f in *; do
  [ -f "$f" ] || continue
  case "$f" in
    *.*) ext=$(printf '%s' "${f##*.}" | tr 'A-Z' 'a-z') ;;
    *)   ext=no_extension ;;
  esac
  mkdir -p "/app/sorted/$ext"
  mv -- "$f" "/app/sorted/$ext/$f"
done
