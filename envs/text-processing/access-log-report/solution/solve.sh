#!/bin/bash
set -euo pipefail
export LC_ALL=C
log=/app/logs/access.log
mkdir -p /app/report
awk '{ n++; ip[$1]; s = $9 + 0
       if (s >= 400 && s < 500) c4++
       if (s >= 500 && s < 600) c5++ }
     END { u = 0; for (i in ip) u++
           printf "total_requests=%d\nunique_clients=%d\nclient_errors=%d\nserver_errors=%d\n", n, u, c4, c5 }' \
  "$log" > /app/report/summary.txt
awk '$9 >= 500 && $9 < 600 { c[$1]++ } END { for (i in c) print c[i], i }' "$log" \
  | sort -k1,1nr -k2,2 > /app/report/errors_by_ip.txt
awk '{ p = $7; sub(/\?.*/, "", p); c[p]++ } END { for (i in c) print c[i], i }' "$log" \
  | sort -k1,1nr -k2,2 | head -n 5 > /app/report/top_paths.txt
