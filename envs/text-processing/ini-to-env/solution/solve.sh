#!/bin/bash
set -euo pipefail
awk '
  function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
  /^[ \t]*([;#]|$)/ { next }
  /^[ \t]*\[/ { sec = trim($0); gsub(/^\[|\]$/, "", sec); sec = trim(sec); next }
  index($0, "=") {
    i = index($0, "=")
    key = trim(substr($0, 1, i - 1)); val = trim(substr($0, i + 1))
    name = toupper(sec "_" key); gsub(/[^A-Z0-9_]/, "_", name)
    print name "=" val
  }
' /app/config/app.ini > /app/config/app.env
