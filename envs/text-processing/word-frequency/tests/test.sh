#!/bin/sh
. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"

tg_check_sh "top_words.txt has exactly 10 lines" \
  '[ "$(grep -c "" /app/top_words.txt)" -eq 10 ]'
tg_check_sh "every line is <word> <count>" \
  '[ -s /app/top_words.txt ] && ! grep -Evq "^[a-z]+ [0-9]+$" /app/top_words.txt'
tg_check_sh "stopwords are excluded" \
  '[ -s /app/top_words.txt ] && ! cut -d" " -f1 /app/top_words.txt | grep -qxE "a|and|at|by|for|from|in|is|it|its|of|on|one|s|that|the|then|they|their|to|was|were|with"'
tg_check_sh "most frequent word and count are right" \
  '[ "$(head -n 1 /app/top_words.txt)" = "keeper 10" ]'
tg_check_sh "first nine lines are right (counts and alphabetical ties)" \
  'head -n 9 /app/top_words.txt | diff - /tests/expected_top9.txt'
tg_check_sh "tie at the cut-off is broken alphabetically" \
  '[ "$(sed -n 10p /app/top_words.txt)" = "burning 3" ]'
tg_finish
