#!/bin/bash
set -euo pipefail
root=/app/project
mkdir -p "$root"
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in
    ''|'#'*) continue ;;
    */) mkdir -p "$root/$line" ;;
    *)  mkdir -p "$root/$(dirname "$line")"
        : > "$root/$line"
        case "$line" in *.sh) chmod 755 "$root/$line" ;; esac ;;
  esac
done < /app/spec/layout.txt
