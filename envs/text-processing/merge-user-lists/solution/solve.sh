#!/bin/bash
set -euo pipefail
export LC_ALL=C
cd /app/lists
sort -u team_a.txt > /tmp/a.sorted
sort -u team_b.txt > /tmp/b.sorted
sort -u team_a.txt team_b.txt > all.txt
comm -12 /tmp/a.sorted /tmp/b.sorted > both.txt
comm -23 /tmp/a.sorted /tmp/b.sorted > only_a.txt
rm -f /tmp/a.sorted /tmp/b.sorted
