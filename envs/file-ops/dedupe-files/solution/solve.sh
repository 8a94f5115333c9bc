#!/bin/bash
set -euo pipefail
export LC_ALL=C
find /app/photos -type f -exec sha256sum {} + | sort -k2 \
  | awk '{ h = $1; p = substr($0, 67); if (h in keep) print p " -> " keep[h]; else keep[h] = p }' \
  | sort > /app/dedupe-report.txt
while IFS= read -r line; do
  rm -f -- "${line%% -> *}"
done < /app/dedupe-report.txt
