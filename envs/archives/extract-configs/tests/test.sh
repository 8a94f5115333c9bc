#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"

tg_check_sh "top-level config files restored with their contents" \
  '[ "$(cat /app/restored/config/server.conf)" = "$(printf "listen = 0.0.0.0:8080\nworkers = 8")" ] && [ "$(cat /app/restored/config/database.conf)" = "$(printf "dsn = postgres://shop@db/shop\npool = 10")" ]'
tg_check_sh "nested config directory restored" \
  '[ "$(cat /app/restored/config/conf.d/logging.conf)" = "level = info" ]'
tg_check_sh "leading shopd-2.4.1/ directory stripped" \
  '[ ! -e /app/restored/shopd-2.4.1 ] && [ -d /app/restored/config ]'
tg_check_sh "nothing but config/ extracted" \
  '[ -d /app/restored ] && [ "$(ls -A /app/restored)" = config ] && [ -z "$(find /app -name VERSION -o -name shopd -o -name README.md)" ]'
tg_check_sh "release tarball still present and intact" \
  '[ "$(tar -tzf /app/releases/shopd-2.4.1.tar.gz | grep -c .)" -eq 11 ]'
tg_finish
