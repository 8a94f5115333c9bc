#!/bin/bash
set -euo pipefail
mkdir -p /app/bin /app/sites
cat > /app/bin/mkvhost <<'SCRIPT'
#!/bin/bash
usage() { echo "usage: mkvhost DOMAIN PORT" >&2; exit 2; }
[ $# -eq 2 ] || usage
domain=$1 port=$2
[[ $port =~ ^[0-9]+$ ]] && [ ${#port} -le 5 ] && [ "$((10#$port))" -ge 1 ] && [ "$((10#$port))" -le 65535 ] || usage
cat <<EOF
server {
    listen 80;
    server_name $domain www.$domain;
    access_log /var/log/nginx/$domain.access.log;

    location / {
        proxy_pass http://127.0.0.1:$port;
    }
}
EOF
SCRIPT
chmod 755 /app/bin/mkvhost
/app/bin/mkvhost shop.example.com 8081 > /app/sites/shop.example.com.conf
