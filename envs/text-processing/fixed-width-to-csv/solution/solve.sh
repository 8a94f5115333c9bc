#!/bin/bash
set -euo pipefail
awk '
  function trim(s) { sub(/^ +/, "", s); sub(/ +$/, "", s); return s }
  function csv(s) { if (s ~ /[",]/) { gsub(/"/, "\"\"", s); s = "\"" s "\"" } return s }
  BEGIN { print "sku,description,qty,price" }
  length($0) >= 41 && substr($0, 41, 16) ~ /^ *[0-9]+ +[0-9]+\.[0-9][0-9]$/ {
    print csv(trim(substr($0, 1, 10))) "," csv(trim(substr($0, 11, 30))) "," \
          trim(substr($0, 41, 6)) "," trim(substr($0, 47, 10))
  }
' /app/reports/inventory.txt > /app/reports/inventory.csv
