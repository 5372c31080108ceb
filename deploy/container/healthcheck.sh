#!/bin/bash
# The image's HEALTHCHECK: GET /health on the server's own port, with bash's /dev/tcp (no curl in
# the image). Healthy only on "200": /health answers 503 once shutdown began or while the worker
# cannot serve, and the port is closed until the model has loaded.
#   ONEBIT_PORT           the port serve listens on (8880, the image's default)
#   ONEBIT_HEALTH_HOST    the address to ask (127.0.0.1; set it when serve listens on one address
#                         that is not loopback or 0.0.0.0)
set -u
host="${ONEBIT_HEALTH_HOST:-127.0.0.1}"
port="${ONEBIT_PORT:-8880}"
exec 3<>"/dev/tcp/$host/$port" || exit 1
# Host names the address asked: serve accepts an IP literal on 0.0.0.0 and its own address.
printf 'GET /health HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$host" >&3 || exit 1
IFS=' ' read -r -t 4 _ status _ <&3 || exit 1
[ "$status" = 200 ]
