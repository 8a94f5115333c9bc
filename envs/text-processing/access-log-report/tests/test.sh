#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"

tg_check_sh "summary: total requests and unique clients" \
  '[ "$(head -n 2 /app/report/summary.txt)" = "$(cat /tests/expected_summary_head.txt)" ]'
tg_check_sh "summary: 4xx and 5xx counts" \
  '[ "$(sed -n 3,4p /app/report/summary.txt)" = "$(cat /tests/expected_summary_tail.txt)" ] && [ "$(grep -c "" /app/report/summary.txt)" -eq 4 ]'
tg_check_sh "errors_by_ip: correct counts per IP" \
  "awk '{ print \$1, \$2 }' /app/report/errors_by_ip.txt | LC_ALL=C sort | diff - /tests/expected_errors_sorted.txt"
tg_check "errors_by_ip: exact order and format" \
  diff /tests/expected_errors_by_ip.txt /app/report/errors_by_ip.txt
tg_check "top_paths: top 5 paths with query strings stripped" \
  diff /tests/expected_top_paths.txt /app/report/top_paths.txt
tg_check_sh "access log unchanged" \
  '[ "$(cksum < /app/logs/access.log)" = "1112253926 14155" ]'
tg_finish
