#!/bin/bash
set -euo pipefail
mkdir -p /app/bin
cat > /app/bin/backup.sh <<'SCRIPT'
#!/bin/bash
set -u
usage() { echo "usage: backup.sh [-k KEEP] SOURCE_DIR DEST_DIR" >&2; exit 2; }
keep=5
while getopts ':k:' opt; do
  case $opt in
    k) keep=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || usage
[[ $keep =~ ^[0-9]+$ ]] && [ "$((10#$keep))" -ge 1 ] || usage
keep=$((10#$keep))
src=$1 dest=$2
[ -d "$src" ] || { echo "backup.sh: not a directory: $src" >&2; exit 1; }
mkdir -p "$dest" || exit 1

max=0
for f in "$dest"/backup-[0-9][0-9][0-9].tar.gz; do
  [ -f "$f" ] || continue
  n=${f##*/backup-}; n=$((10#${n%.tar.gz}))
  [ "$n" -gt "$max" ] && max=$n
done
new=$(printf '%s/backup-%03d.tar.gz' "$dest" $((max + 1)))
tar -czf "$new" -C "$src" . || { rm -f "$new"; exit 1; }

mapfile -t all < <(printf '%s\n' "$dest"/backup-[0-9][0-9][0-9].tar.gz | LC_ALL=C sort)
excess=$(( ${#all[@]} - keep ))
for ((i = 0; i < excess; i++)); do rm -f -- "${all[$i]}"; done
echo "$new"
SCRIPT
chmod 755 /app/bin/backup.sh
