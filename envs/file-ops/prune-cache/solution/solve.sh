#!/bin/bash
set -euo pipefail
{ find /app/cache -type f ! -newermt '2024-01-01 00:00:00 UTC'
  find /app/cache -type f -size +524288c; } | LC_ALL=C sort -u > /app/pruned.txt
while IFS= read -r f; do rm -f -- "$f"; done < /app/pruned.txt
find /app/cache -mindepth 1 -depth -type d -empty -delete
