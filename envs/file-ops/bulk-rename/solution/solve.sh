#!/bin/bash
set -euo pipefail
cd /app/reports
for f in sales_report_[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9].csv; do
  [ -f "$f" ] || continue
  d=${f#sales_report_}; d=${d%.csv}
  mv -- "$f" "${d:0:4}-${d:4:2}-${d:6:2}_sales.csv"
done
