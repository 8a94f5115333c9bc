#!/bin/bash
set -euo pipefail
mkdir -p /app/out
{
  echo "region,orders,revenue"
  awk -F, 'NR > 1 && NF >= 5 { n[$2]++; rev[$2] += $4 * $5 }
           END { for (r in n) printf "%s,%d,%.2f\n", r, n[r], rev[r] }' /app/data/sales.csv \
    | sort -t, -k3,3 -gr
} > /app/out/revenue_by_region.csv
