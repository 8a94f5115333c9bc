#!/bin/bash
set -euo pipefail
mkdir -p /app/restored
tar -xzf /app/releases/shopd-2.4.1.tar.gz -C /app/restored --strip-components=1 shopd-2.4.1/config
