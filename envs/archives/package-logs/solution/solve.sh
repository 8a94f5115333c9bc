#!/bin/bash
set -euo pipefail
mkdir -p /app/dist
cd /app/logs
find . -path ./tmp -prune -o -type f -name '*.log' -print | sed 's|^\./||' | LC_ALL=C sort > /tmp/loglist
tar -czf /app/dist/logs-bundle.tar.gz -T /tmp/loglist
rm -f /tmp/loglist
cd /app/dist
sha256sum logs-bundle.tar.gz > logs-bundle.sha256
