#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"

tg_check_sh "app.env has one line per setting and nothing else" \
  '[ "$(grep -c "" /app/config/app.env)" -eq 13 ] && ! grep -Eq "^[[:space:]]*([;#]|$)" /app/config/app.env'
tg_check_sh "server section converted" \
  'grep -qx "SERVER_HOST=0.0.0.0" /app/config/app.env && grep -qx "SERVER_PORT=8080" /app/config/app.env && grep -qx "SERVER_WORKERS=4" /app/config/app.env'
tg_check_sh "dashes in keys become underscores" \
  'grep -qx "DATABASE_CONNECT_TIMEOUT=30" /app/config/app.env && grep -qx "FEATURE_FLAGS_BETA_REPORTS=false" /app/config/app.env'
tg_check_sh "value split at the first = only" \
  'grep -qx "DATABASE_PASSWORD=s3cr3t=with=equals" /app/config/app.env'
tg_check_sh "inner whitespace of values kept" \
  'grep -qx "FEATURE_FLAGS_WELCOME_MESSAGE=Hello,   world!" /app/config/app.env'
tg_check "whole file matches, in input order" \
  diff /tests/expected.env /app/config/app.env
tg_check_sh "app.ini left unchanged" \
  '[ "$(cksum < /app/config/app.ini)" = "1891900516 446" ]'
tg_finish
