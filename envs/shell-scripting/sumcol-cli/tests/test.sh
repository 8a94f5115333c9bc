#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"
T=/tmp/termgym-sumcol-cli-test
rm -rf "$T" && mkdir -p "$T"
printf '3,a\n4,b\n\n-2,c\n' > "$T/plain.csv"
printf 'id;name;score\n1;ann;40\n2;bob;2\n3;cy;-7\n' > "$T/semi.csv"
printf '1;ann;40\n2;bob;2\n3;cy;-7\n' > "$T/semi2.csv"
printf 'qty,item\n5,x\n6,y\n' > "$T/h1.csv"
printf 'qty,item\n100,z\n' > "$T/h2.csv"
export T

tg_check "sumcol exists and is executable" test -x /app/bin/sumcol
tg_check_sh "sums the first comma-separated column by default" \
  '[ "$(/app/bin/sumcol "$T/plain.csv")" = 5 ]'
tg_check_sh "-d and -f select delimiter and column" \
  '[ "$(/app/bin/sumcol -d ";" -f 3 "$T/semi2.csv")" = 35 ] && [ "$(/app/bin/sumcol -f 1 -d ";" "$T/semi2.csv")" = 6 ]'
tg_check_sh "reads standard input when no file is given" \
  '[ "$(printf "10\n20\n-5\n" | /app/bin/sumcol)" = 25 ]'
tg_check_sh "-H skips the header of each file and totals several files" \
  '[ "$(/app/bin/sumcol -H "$T/h1.csv" "$T/h2.csv")" = 111 ] && [ "$(/app/bin/sumcol -H -d ";" -f 3 "$T/semi.csv")" = 35 ]'
tg_check_sh "usage errors exit 2 with nothing on stdout" \
  'for args in "-z" "-f 0" "-f abc" "-d" "-d ab"; do out=$(/app/bin/sumcol $args "$T/plain.csv" 2>/dev/null); rc=$?; [ $rc -eq 2 ] && [ -z "$out" ] || { echo "args [$args]: rc=$rc out=[$out]"; exit 1; }; done'
tg_check_sh "unreadable file exits 1 with an error on stderr only" \
  'out=$(/app/bin/sumcol "$T/plain.csv" "$T/missing.csv" 2>"$T/err"); rc=$?; [ $rc -eq 1 ] && [ -z "$out" ] && [ -s "$T/err" ]'
rm -rf "$T"
tg_finish
