#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"
F=/app/bin/ipv4-filter

tg_check "ipv4-filter exists and is executable" test -x $F
tg_check_sh "keeps ordinary valid addresses in input order" \
  '[ "$(printf "8.8.8.8\n0.0.0.0\n255.255.255.255\n192.168.10.1\n" | /app/bin/ipv4-filter | tr "\n" " ")" = "8.8.8.8 0.0.0.0 255.255.255.255 192.168.10.1 " ]'
tg_check_sh "drops numbers above 255" \
  '[ "$(printf "256.1.1.1\n1.2.3.300\n7.7.7.7\n10.999.0.1\n" | /app/bin/ipv4-filter)" = 7.7.7.7 ]'
tg_check_sh "drops wrong shapes (parts, letters, spaces, dots)" \
  '[ "$(printf "1.2.3\n1.2.3.4.5\n1..3.4\na.b.c.d\n1.2.3.4.\n 1.2.3.4\n1.2.3.4 \n-1.2.3.4\n\n1.2.3.4\n" | /app/bin/ipv4-filter)" = 1.2.3.4 ]'
tg_check_sh "drops numbers with leading zeros" \
  '[ "$(printf "01.2.3.4\n10.0.0.010\n10.0.0.0\n192.168.00.1\n" | /app/bin/ipv4-filter)" = 10.0.0.0 ]'
tg_check_sh "-v prints the invalid lines instead, empty lines included" \
  '[ "$(printf "1.1.1.1\nx\n\n2.2.2.256\n3.3.3.3\n" | /app/bin/ipv4-filter -v | tr "\n" "|")" = "x||2.2.2.256|" ]'
tg_check_sh "exit status 0 when something printed, 1 when nothing" \
  'printf "1.2.3.4\n" | /app/bin/ipv4-filter >/dev/null; [ $? -eq 0 ] || exit 1; printf "nope\n" | /app/bin/ipv4-filter >/dev/null; [ $? -eq 1 ] || exit 1; printf "1.2.3.4\n" | /app/bin/ipv4-filter -v >/dev/null; [ $? -eq 1 ]'
tg_check_sh "bad option or extra argument exits 2" \
  'printf "1.2.3.4\n" | /app/bin/ipv4-filter -x >/dev/null 2>&1; [ $? -eq 2 ] || exit 1; printf "1.2.3.4\n" | /app/bin/ipv4-filter -v extra >/dev/null 2>&1; [ $? -eq 2 ]'
tg_finish
