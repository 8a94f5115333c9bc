#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"
cd /app/photos || exit 1

tg_check_sh "duplicate copies are deleted" \
  'for f in 2024/beach-copy.jpg inbox/IMG_0001.jpg inbox/IMG_0002.jpg inbox/IMG_0004.jpg inbox/IMG_0005.jpg; do [ ! -e "$f" ] || { echo "still there: $f"; exit 1; }; done'
tg_check_sh "the first path of each duplicate group is kept" \
  '[ "$(cat 2023/summer/beach.jpg)" = "JPEG beach sunset" ] && [ "$(cat 2023/summer/hike.jpg)" = "JPEG mountain hike" ] && [ "$(cat 2023/winter/city.jpg)" = "JPEG city at night" ]'
tg_check_sh "same-size files with different contents are kept" \
  '[ -f 2023/winter/snow.jpg ] && [ -f inbox/IMG_0003.jpg ] && [ -f 2024/cake.jpg ] && [ -f 2024/cake-edited.jpg ]'
tg_check_sh "unique files untouched and directories kept" \
  '[ "$(cat 2024/dinner.jpg)" = "JPEG family dinner" ] && [ -d inbox ] && [ -d 2023/summer ] && [ -d 2023/winter ] && [ -d 2024 ]'
tg_check_sh "exactly 8 files remain" \
  '[ "$(find . -type f | wc -l)" -eq 8 ]'
tg_check "report lists each deleted file and its kept twin" \
  diff /tests/expected_report.txt /app/dedupe-report.txt
tg_finish
