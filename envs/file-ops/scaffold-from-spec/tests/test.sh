#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"

tg_check_sh "directories from the spec exist" \
  'cd /app/project && for p in src src/ledger src/ledger/api tests docs scripts config data/raw data/processed; do [ -d "$p" ] || { echo "missing dir $p"; exit 1; }; done'
tg_check_sh "files from the spec exist" \
  'cd /app/project && for p in src/ledger/__init__.py src/ledger/models.py src/ledger/api/routes.py tests/test_models.py docs/index.md scripts/bootstrap.sh scripts/release.sh config/settings.example.toml README.md; do [ -f "$p" ] || { echo "missing file $p"; exit 1; }; done'
tg_check_sh "created files are empty" \
  'cd /app/project && [ -n "$(find . -type f)" ] && [ -z "$(find . -type f ! -empty)" ]'
tg_check_sh "shell scripts are mode 755" \
  '[ "$(stat -c %a /app/project/scripts/bootstrap.sh)" = 755 ] && [ "$(stat -c %a /app/project/scripts/release.sh)" = 755 ]'
tg_check_sh "nothing outside the spec was created" \
  'cd /app/project && find . -mindepth 1 -printf "%p %y\n" | LC_ALL=C sort | diff /tests/expected_tree.txt -'
tg_finish
