#!/bin/bash
set -euo pipefail
export LC_ALL=C
mkdir -p /app/restore
tar -xzf /app/backup/data.tar.gz -C /app/restore
cd /app/restore
work=$(mktemp -d)
: > "$work/report"
# files listed in the manifest
while IFS= read -r line; do
  hash=${line%%  *}; path=${line#*  }
  printf '%s\n' "$path" >> "$work/listed"
  if [ ! -f "$path" ]; then
    printf 'MISSING %s\n' "$path" >> "$work/report"
  elif [ "$(sha256sum < "$path" | cut -d' ' -f1)" != "$hash" ]; then
    printf 'FAILED %s\n' "$path" >> "$work/report"
    rm -f -- "$path"
  fi
done < /app/backup/MANIFEST.sha256
# files in the archive that the manifest does not list
find . -type f | sed 's|^\./||' | sort > "$work/present"
sort -o "$work/listed" "$work/listed"
comm -23 "$work/present" "$work/listed" | while IFS= read -r path; do
  printf 'EXTRA %s\n' "$path" >> "$work/report"
  rm -f -- "$path"
done
sort -k2 "$work/report" > /app/restore-report.txt
rm -rf "$work"
