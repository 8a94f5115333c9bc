#!/bin/bash
set -euo pipefail
cat > /app/bin/normalize-names.sh <<'SCRIPT'
#!/bin/bash
# normalize-names.sh DIR
# Renames the files in DIR to lowercase, with spaces replaced by underscores.

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: normalize-names.sh DIR" >&2
  exit 2
fi
dir=$1
status=0
for path in "$dir"/* "$dir"/.[!.]* "$dir"/..?*; do
  [ -f "$path" ] && [ ! -L "$path" ] || continue
  f=${path##*/}
  new=$(printf '%s' "$f" | tr 'A-Z ' 'a-z_')
  [ "$f" = "$new" ] && continue
  if [ -e "$dir/$new" ] || [ -L "$dir/$new" ]; then
    echo "skip: $f" >&2
    status=1
    continue
  fi
  mv -- "$path" "$dir/$new"
done
exit $status
SCRIPT
chmod 755 /app/bin/normalize-names.sh
