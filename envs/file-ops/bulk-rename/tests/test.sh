#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"
cd /app/reports || exit 1
NEW="2024-01-15 2024-02-12 2024-03-11 2024-04-15 2024-05-13 2024-06-10 2024-07-15 2024-11-04"

tg_check_sh "all eight files exist under their new names" \
  "for d in $NEW; do test -f \"\${d}_sales.csv\" || { echo \"missing \${d}_sales.csv\"; exit 1; }; done"
tg_check_sh "no file with the old dated name remains" \
  '! ls | grep -Eq "^sales_report_[0-9]{8}\.csv$"'
tg_check_sh "each renamed file holds the report for its own date" \
  "n=0; for d in $NEW; do [ -f \"\${d}_sales.csv\" ] || continue; n=\$((n+1)); [ \"\$(head -n 1 \"\${d}_sales.csv\")\" = \"report_date,\$d\" ] || { echo \"wrong content in \${d}_sales.csv\"; exit 1; }; done; [ \$n -gt 0 ]"
tg_check_sh "README.txt and sales_report_draft.csv left untouched" \
  '[ "$(cat README.txt)" = "Monthly sales exports. Do not edit by hand." ] && [ "$(cat sales_report_draft.csv)" = "$(printf "region,units\nnorth,0")" ]'
tg_check_sh "directory holds exactly the 10 expected names, no copies" \
  'ls -A | LC_ALL=C sort | diff - /tests/expected_listing.txt'
tg_finish
