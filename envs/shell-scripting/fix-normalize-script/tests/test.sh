#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"
T=/tmp/termgym-fix-normalize-script-test
rm -rf "$T" && mkdir -p "$T"
export T
S=/app/bin/normalize-names.sh

tg_check "script still at /app/bin/normalize-names.sh and executable" test -x $S
tg_check_sh "lowercases simple names" \
  'mkdir "$T/a" && echo 1 > "$T/a/README.MD" && echo 2 > "$T/a/Photo.JPG" && /app/bin/normalize-names.sh "$T/a" && [ "$(cat "$T/a/readme.md")" = 1 ] && [ "$(cat "$T/a/photo.jpg")" = 2 ] && [ "$(ls "$T/a" | wc -l)" -eq 2 ]'
tg_check_sh "handles spaces and shell-special characters" \
  'mkdir "$T/b" && echo 1 > "$T/b/My Report.txt" && echo 2 > "$T/b/Two  Spaces.TXT" && echo 3 > "$T/b/Star*Dollar\$.txt" && echo 4 > "$T/b/It'"'"'s Here" && /app/bin/normalize-names.sh "$T/b" && [ "$(cat "$T/b/my_report.txt")" = 1 ] && [ "$(cat "$T/b/two__spaces.txt")" = 2 ] && [ "$(cat "$T/b/star*dollar\$.txt")" = 3 ] && [ "$(cat "$T/b/it'"'"'s_here")" = 4 ] && [ "$(ls "$T/b" | wc -l)" -eq 4 ]'
tg_check_sh "never overwrites: skips, reports on stderr, exits 1" \
  'mkdir "$T/c" && echo old > "$T/c/data.csv" && echo new > "$T/c/DATA.csv" && echo x > "$T/c/Other.TXT" && /app/bin/normalize-names.sh "$T/c" 2>"$T/c.err"; rc=$?; [ $rc -eq 1 ] && [ "$(cat "$T/c/data.csv")" = old ] && [ "$(cat "$T/c/DATA.csv")" = new ] && [ -f "$T/c/other.txt" ] && grep -qx "skip: DATA.csv" "$T/c.err"'
tg_check_sh "sub-directories are not renamed or entered" \
  'mkdir -p "$T/d/Sub Dir" && echo 1 > "$T/d/Sub Dir/Inner FILE" && echo 2 > "$T/d/Top FILE" && /app/bin/normalize-names.sh "$T/d" && [ -d "$T/d/Sub Dir" ] && [ -f "$T/d/Sub Dir/Inner FILE" ] && [ -f "$T/d/top_file" ]'
tg_check_sh "bad arguments exit 2 and rename nothing" \
  '/app/bin/normalize-names.sh "$T/missing" 2>/dev/null; [ $? -eq 2 ] || exit 1; /app/bin/normalize-names.sh 2>/dev/null; [ $? -eq 2 ] || exit 1; mkdir "$T/e" && echo 1 > "$T/e/ABC"; /app/bin/normalize-names.sh "$T/e" "$T/e" 2>/dev/null; [ $? -eq 2 ] && [ -f "$T/e/ABC" ]'
rm -rf "$T"
tg_finish
