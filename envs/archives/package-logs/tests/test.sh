#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"
A=/app/dist/logs-bundle.tar.gz
T=/tmp/termgym-package-logs-test
rm -rf "$T" && mkdir -p "$T"
export T
tar -tzf "$A" 2>/dev/null | grep -v '/$' | LC_ALL=C sort > "$T/members"
sed -e 's|^/||' -e 's|^\./||' -e 's|^app/logs/||' "$T/members" > "$T/names"

tg_check "archive is a readable gzip tar" tar -tzf $A
tg_check_sh "all .log files outside tmp/ are included" \
  'for m in $(cat /tests/expected_members.txt); do grep -qx "$m" "$T/names" || { echo "missing $m"; exit 1; }; done'
tg_check_sh "member names are relative to /app/logs" \
  '[ -s "$T/members" ] && ! grep -Eq "^(/|\./|app/)" "$T/members"'
tg_check_sh "no tmp/ logs, rotated logs or non-log files" \
  '[ -s "$T/members" ] && ! grep -Eq "^tmp/|\.log\.1$|\.pid$|README" "$T/names"'
tg_check "archive holds exactly the expected files" \
  diff /tests/expected_members.txt "$T/members"
tg_check_sh "archived contents match the originals" \
  'mkdir "$T/x" && tar -xzf /app/dist/logs-bundle.tar.gz -C "$T/x" && [ "$(cat "$T/x/web/access.log")" = "$(cat /app/logs/web/access.log)" ] && [ "$(cat "$T/x/worker/queue/queue.log")" = "queue depth 3" ]'
tg_check_sh "checksum file verifies the archive" \
  'cd /app/dist && grep -Eq "^[0-9a-f]{64}  logs-bundle\.tar\.gz$" logs-bundle.sha256 && sha256sum -c --quiet logs-bundle.sha256'
tg_check_sh "/app/logs left intact" \
  '[ "$(find /app/logs -type f | wc -l)" -eq 11 ] && [ "$(cat /app/logs/tmp/debug.log)" = scratch ]'
rm -rf "$T"
tg_finish
