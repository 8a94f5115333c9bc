#!/bin/bash
set -euo pipefail
export LC_ALL=C
cat /app/docs/*.txt | tr 'A-Z' 'a-z' | tr -cs 'a-z' '\n' | grep -v '^$' \
  | grep -vxF -f /app/stopwords.txt \
  | sort | uniq -c | awk '{ print $2, $1 }' \
  | sort -k2,2nr -k1,1 | head -n 10 > /app/top_words.txt
