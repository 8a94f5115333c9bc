#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"

tg_check_sh "text files sorted into txt/ with names kept" \
  'cd /app/sorted && test -f txt/notes.txt && test -f txt/todo.TXT && test -f "txt/meeting notes.txt"'
tg_check_sh "images sorted into jpg/ and jpeg/ (extension lowercased)" \
  'cd /app/sorted && test -f jpg/photo1.jpg && test -f jpg/photo2.JPG && test -f jpeg/scan.jpeg'
tg_check_sh "multi-dot names use the last extension" \
  'cd /app/sorted && test -f gz/logs.tar.gz && test -f csv/data.backup.csv && test -f csv/prices.csv && test -f md/readme.md && test -f md/CHANGELOG.md'
tg_check_sh "files without a dot go to no_extension/" \
  'cd /app/sorted && test -f no_extension/Makefile && test -f no_extension/LICENSE'
tg_check_sh "inbox still exists and is empty" \
  'test -d /app/inbox && [ -z "$(ls -A /app/inbox)" ]'
tg_check_sh "sorted/ holds exactly the expected directories" \
  '[ "$(cd /app/sorted && find . -mindepth 1 -type d | LC_ALL=C sort | tr "\n" " ")" = "./csv ./gz ./jpeg ./jpg ./md ./no_extension ./txt " ]'
tg_check_sh "moved files have unchanged contents" \
  'cd /app/sorted && sha256sum -c --quiet --ignore-missing /tests/expected.sha256'
tg_finish
