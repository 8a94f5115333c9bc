#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"
C=/app/cache

tg_check_sh "files modified before 2024 are deleted" \
  'for f in a/old1.dat c/old2.dat c/sub/old3.dat d/eve.txt top-old.txt; do [ ! -e "/app/cache/$f" ] || { echo "still there: $f"; exit 1; }; done'
tg_check_sh "files larger than 512 KiB are deleted" \
  '[ ! -e /app/cache/b/big.bin ] && [ ! -e /app/cache/d/huge-old.bin ]'
tg_check_sh "recent small files are kept unchanged" \
  '[ "$(cat /app/cache/a/new1.dat)" = "fresh entry 1" ] && [ "$(cat /app/cache/d/recent.log)" = "recent log line" ] && [ "$(cat /app/cache/d/morning.txt)" = "new year morning" ] && [ "$(cat /app/cache/top-new.txt)" = "new top-level" ]'
tg_check_sh "file of exactly 512 KiB is kept" \
  '[ "$(stat -c %s /app/cache/b/exact.bin)" -eq 524288 ]'
tg_check_sh "emptied directories removed, others kept" \
  '[ ! -e /app/cache/c ] && [ -d /app/cache ] && [ -d /app/cache/a ] && [ -d /app/cache/b ] && [ -d /app/cache/d ]'
tg_check "pruned.txt lists exactly the deleted files in order" \
  diff /tests/expected_pruned.txt /app/pruned.txt
tg_finish
