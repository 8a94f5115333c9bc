#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"

tg_check_sh "summary has the exact header line" \
  '[ "$(head -n 1 /app/out/revenue_by_region.csv)" = "region,orders,revenue" ]'
tg_check_sh "one data line per region (5 regions)" \
  '[ "$(tail -n +2 /app/out/revenue_by_region.csv | grep -c .)" -eq 5 ] && [ "$(grep -c "" /app/out/revenue_by_region.csv)" -eq 6 ]'
tg_check_sh "order counts per region are correct" \
  '[ "$(tail -n +2 /app/out/revenue_by_region.csv | cut -d, -f1,2 | LC_ALL=C sort | tr "\n" " ")" = "central,9 east,15 north,11 south,6 west,1 " ]'
tg_check_sh "revenue per region is correct, two decimals" \
  '[ "$(tail -n +2 /app/out/revenue_by_region.csv | cut -d, -f1,3 | LC_ALL=C sort | tr "\n" " ")" = "central,1188.27 east,2807.09 north,2263.88 south,1599.83 west,232.50 " ]'
tg_check_sh "regions sorted by revenue, highest first" \
  '[ "$(tail -n +2 /app/out/revenue_by_region.csv | cut -d, -f1 | tr "\n" " ")" = "east north south central west " ]'
tg_check_sh "input data unchanged" \
  '[ "$(cksum < /app/data/sales.csv)" = "3282778787 1172" ]'
tg_finish
