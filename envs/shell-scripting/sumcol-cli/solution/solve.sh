#!/bin/bash
set -euo pipefail
mkdir -p /app/bin
cat > /app/bin/sumcol <<'SCRIPT'
#!/bin/bash
usage() { echo "usage: sumcol [-d DELIM] [-f FIELD] [-H] [FILE...]" >&2; exit 2; }
delim=, field=1 header=0
while getopts ':d:f:H' opt; do
  case $opt in
    d) delim=$OPTARG ;;
    f) field=$OPTARG ;;
    H) header=1 ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ "${#delim}" -eq 1 ] || usage
[[ $field =~ ^[0-9]+$ ]] && [ "$field" -ge 1 ] || usage
for f in "$@"; do
  if [ ! -f "$f" ] || [ ! -r "$f" ]; then echo "sumcol: cannot read '$f'" >&2; exit 1; fi
done
[ $# -gt 0 ] || set -- -
awk -F "$delim" -v f="$field" -v h="$header" '
  FNR == 1 && h { next }
  NF == 0 { next }
  { s += $f }
  END { printf "%d\n", s }' "$@"
SCRIPT
chmod 755 /app/bin/sumcol
