#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"

tg_check "all.txt is the sorted union without duplicates" \
  diff /tests/expected_all.txt /app/lists/all.txt
tg_check "both.txt is the sorted intersection" \
  diff /tests/expected_both.txt /app/lists/both.txt
tg_check "only_a.txt holds team A members missing from team B" \
  diff /tests/expected_only_a.txt /app/lists/only_a.txt
tg_check_sh "input lists unchanged" \
  '[ "$(cat /app/lists/team_a.txt | tr "\n" " ")" = "mchen aokafor jsmith priya.r lbernard jsmith tnguyen aokafor dkowalski zoe_w " ] && [ "$(cat /app/lists/team_b.txt | tr "\n" " ")" = "rgarcia jsmith emueller tnguyen mchen sato.k rgarcia bwilliams priya.r " ]'
tg_finish
