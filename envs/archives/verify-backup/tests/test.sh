#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"

tg_check_sh "intact files restored with correct contents" \
  'cd /app/restore && sha256sum -c --quiet /tests/expected_good.sha256'
tg_check_sh "corrupted files removed from the restore" \
  '[ -d /app/restore ] && [ ! -e /app/restore/invoices/inv-1002.txt ] && [ ! -e /app/restore/records/2024-02.csv ]'
tg_check_sh "unlisted extra file removed from the restore" \
  '[ -d /app/restore/invoices ] && [ ! -e /app/restore/invoices/inv-9999.txt ]'
tg_check_sh "restore holds exactly the verified files" \
  '[ "$(find /app/restore -type f | wc -l)" -eq 6 ]'
tg_check_sh "report lists the corrupted files as FAILED" \
  'grep -qx "FAILED invoices/inv-1002.txt" /app/restore-report.txt && grep -qx "FAILED records/2024-02.csv" /app/restore-report.txt'
tg_check_sh "report lists the missing and the extra file" \
  'grep -qx "MISSING records/2024-04.csv" /app/restore-report.txt && grep -qx "EXTRA invoices/inv-9999.txt" /app/restore-report.txt'
tg_check "report is complete and sorted by path" \
  diff /tests/expected_report.txt /app/restore-report.txt
tg_check_sh "backup files left unchanged" \
  'cmp -s /tests/MANIFEST.sha256 /app/backup/MANIFEST.sha256 && [ "$(tar -tzf /app/backup/data.tar.gz | grep -vc "/$")" -eq 9 ]'
tg_finish
