#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"

tg_check "mkvhost exists and is executable" test -x /app/bin/mkvhost
tg_check_sh "prints the exact template for a domain and port" \
  '/app/bin/mkvhost blog.test 3000 | diff /tests/expected_blog.conf -'
tg_check_sh "exits 0 on success" \
  '/app/bin/mkvhost a.example 1 >/dev/null && /app/bin/mkvhost b.example 65535 >/dev/null'
tg_check_sh "wrong number of arguments exits 2 with empty stdout" \
  'for a in "" "only.one" "a b c"; do out=$(/app/bin/mkvhost $a 2>/dev/null); rc=$?; [ $rc -eq 2 ] && [ -z "$out" ] || { echo "args [$a]: rc=$rc"; exit 1; }; done'
tg_check_sh "invalid port exits 2 with empty stdout" \
  'for p in 0 65536 80a -1 99999999999; do out=$(/app/bin/mkvhost x.test "$p" 2>/dev/null); rc=$?; [ $rc -eq 2 ] && [ -z "$out" ] || { echo "port [$p]: rc=$rc"; exit 1; }; done'
tg_check "site config for shop.example.com written" \
  diff /tests/expected_shop.conf /app/sites/shop.example.com.conf
tg_finish
