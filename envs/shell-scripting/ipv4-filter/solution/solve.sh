#!/bin/bash
set -euo pipefail
mkdir -p /app/bin
cat > /app/bin/ipv4-filter <<'SCRIPT'
#!/bin/bash
usage() { echo "usage: ipv4-filter [-v] < input" >&2; exit 2; }
invert=0
case $# in
  0) ;;
  1) [ "$1" = "-v" ] && invert=1 || usage ;;
  *) usage ;;
esac
octet='(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])'
re="^$octet\\.$octet\\.$octet\\.$octet\$"
printed=1
while IFS= read -r line || [ -n "$line" ]; do
  if [[ $line =~ $re ]]; then valid=1; else valid=0; fi
  if [ "$valid" -ne "$invert" ]; then
    printf '%s\n' "$line"
    printed=0
  fi
done
exit $printed
SCRIPT
chmod 755 /app/bin/ipv4-filter
