#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"
T=/tmp/termgym-backup-rotate-test
rm -rf "$T" && mkdir -p "$T"
mkdir -p "$T/src/sub" && printf 'alpha\n' > "$T/src/a.txt" && printf 'beta\n' > "$T/src/sub/b.txt"
export T
B=/app/bin/backup.sh

tg_check "backup.sh exists and is executable" test -x $B
tg_check_sh "first run creates backup-001.tar.gz and prints its path" \
  'out=$(/app/bin/backup.sh "$T/src" "$T/d1"); [ "$out" = "$T/d1/backup-001.tar.gz" ] && [ -f "$T/d1/backup-001.tar.gz" ]'
tg_check_sh "archive restores the source files relative to the source dir" \
  '/app/bin/backup.sh "$T/src" "$T/d7" >/dev/null; mkdir "$T/x" && tar -xzf "$T/d7/backup-001.tar.gz" -C "$T/x" && [ "$(cat "$T/x/a.txt")" = alpha ] && [ "$(cat "$T/x/sub/b.txt")" = beta ]'
tg_check_sh "numbering continues after the highest existing number" \
  'mkdir -p "$T/d2" && : > "$T/d2/backup-002.tar.gz" && : > "$T/d2/backup-007.tar.gz" && out=$(/app/bin/backup.sh "$T/src" "$T/d2") && [ "$out" = "$T/d2/backup-008.tar.gz" ] && [ -s "$T/d2/backup-008.tar.gz" ]'
tg_check_sh "keeps the 5 newest archives by default, other files untouched" \
  'mkdir -p "$T/d3" && for n in 001 002 003 004 005 006; do : > "$T/d3/backup-$n.tar.gz"; done && echo keep > "$T/d3/notes.txt" && /app/bin/backup.sh "$T/src" "$T/d3" >/dev/null && [ "$(cd "$T/d3" && LC_ALL=C ls | tr "\n" " ")" = "backup-003.tar.gz backup-004.tar.gz backup-005.tar.gz backup-006.tar.gz backup-007.tar.gz notes.txt " ]'
tg_check_sh "-k KEEP limits the number of archives" \
  'mkdir -p "$T/d4" && for i in 1 2 3; do /app/bin/backup.sh -k 2 "$T/src" "$T/d4" >/dev/null || exit 1; done && [ "$(cd "$T/d4" && LC_ALL=C ls | tr "\n" " ")" = "backup-002.tar.gz backup-003.tar.gz " ]'
tg_check_sh "missing source dir exits 1 and creates nothing" \
  '/app/bin/backup.sh "$T/nope" "$T/d5" >/dev/null 2>&1; rc=$?; [ $rc -eq 1 ] && [ ! -e "$T/d5" ]'
tg_check_sh "usage errors exit 2" \
  '/app/bin/backup.sh "$T/src" >/dev/null 2>&1; [ $? -eq 2 ] || exit 1; /app/bin/backup.sh -k 0 "$T/src" "$T/d6" >/dev/null 2>&1; [ $? -eq 2 ] || exit 1; /app/bin/backup.sh -k two "$T/src" "$T/d6" >/dev/null 2>&1; [ $? -eq 2 ] || exit 1; /app/bin/backup.sh -x "$T/src" "$T/d6" >/dev/null 2>&1; [ $? -eq 2 ]'
rm -rf "$T"
tg_finish
