#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"
cd /app/site || exit 1

tg_check_sh "public directories are 755" \
  'bad=$(find . -path ./private -prune -o -type d ! -perm 755 -print); [ -z "$bad" ] || { echo "$bad"; exit 1; }'
tg_check_sh "ordinary files are 644" \
  'bad=$(find . -path ./private -prune -o -type f ! -path "./bin/*.sh" ! -perm 644 -print); [ -z "$bad" ] || { echo "$bad"; exit 1; }'
tg_check_sh "bin/*.sh scripts are 755" \
  '[ "$(stat -c %a bin/deploy.sh)" = 755 ] && [ "$(stat -c %a bin/cleanup.sh)" = 755 ]'
tg_check_sh "bin/README is not executable" \
  '[ "$(stat -c %a bin/README)" = 644 ]'
tg_check_sh "private directories are 700" \
  '[ "$(stat -c %a private)" = 700 ] && [ "$(stat -c %a private/keys)" = 700 ]'
tg_check_sh "private files are 600" \
  '[ "$(stat -c %a private/credentials.env)" = 600 ] && [ "$(stat -c %a private/keys/site.key)" = 600 ]'
tg_check_sh "no file created, deleted or modified" \
  'find . -type f | LC_ALL=C sort | while read -r f; do printf "%s " "$f"; cat "$f"; done | cksum | grep -qx "3894081767 421"'
tg_finish
