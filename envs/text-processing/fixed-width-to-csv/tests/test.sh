#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"

tg_check_sh "CSV starts with the header line" \
  '[ "$(head -n 1 /app/reports/inventory.csv)" = "sku,description,qty,price" ]'
tg_check_sh "one line per data row, no report furniture" \
  '[ "$(grep -c "" /app/reports/inventory.csv)" -eq 11 ] && ! grep -Eq "^-|Total items|INVENTORY REPORT|Warehouse|^SKU" /app/reports/inventory.csv'
tg_check_sh "plain rows are trimmed" \
  'grep -qx "HW-1002,Washer M8,5400,0.03" /app/reports/inventory.csv && grep -qx "TL-0007,Claw hammer 16oz,14,18.90" /app/reports/inventory.csv'
tg_check_sh "fields with commas are quoted" \
  "grep -qx 'HW-1001,\"Hex bolt M8, zinc plated\",1200,0.12' /app/reports/inventory.csv && grep -qx 'PT-0501,\"Primer, white, 1L\",0,11.95' /app/reports/inventory.csv"
tg_check_sh "double quotes inside a field are doubled" \
  "grep -qx 'HW-3100,\"Shelf bracket 6\"\" steel\",120,1.75' /app/reports/inventory.csv"
tg_check "whole CSV matches in original order" \
  diff /tests/expected.csv /app/reports/inventory.csv
tg_finish
