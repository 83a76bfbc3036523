#!/bin/sh
# The sandbox's first process after init: wait for the sandgate address, trust the proxy CA,
# start execd on that address, then run the sandbox's own entrypoint (the arguments).
#
# The runtime moves the sandbox's veth into this network namespace after the container starts,
# so execd cannot bind its address before it appears. Nothing here needs a capability.
set -eu

: "${SANDGATE_ADDRESS:?set by the runtime: the sandbox address execd listens on}"
port="${SANDGATE_EXECD_PORT:-44772}"

tries=0
until ip -o -4 addr show 2>/dev/null | grep -q "inet $SANDGATE_ADDRESS/"; do
  tries=$((tries + 1))
  if [ "$tries" -gt 3000 ]; then
    echo "sandgate-entry: address $SANDGATE_ADDRESS did not appear within 30 s; is the runtime joining the netns?" >&2
    exit 1
  fi
  sleep 0.01
done

# Trust: the system bundle plus the proxy CA (mounted read-only by the runtime when it has one).
# /etc/ssl/certs/ca-certificates.crt is a symlink to this file, for tools that ignore the env vars.
mkdir -p /run/sandgate
if [ -s /etc/sandgate/proxy-ca.crt ]; then
  cat /usr/share/sandgate/system-ca.crt /etc/sandgate/proxy-ca.crt > /run/sandgate/ca-bundle.crt
else
  cat /usr/share/sandgate/system-ca.crt > /run/sandgate/ca-bundle.crt
fi

token="${SANDGATE_EXECD_TOKEN:-}"
unset SANDGATE_EXECD_TOKEN
if [ -n "$token" ]; then
  python3 -m sandgate.execd --host "$SANDGATE_ADDRESS" --port "$port" --token "$token" &
else
  python3 -m sandgate.execd --host "$SANDGATE_ADDRESS" --port "$port" &
fi
unset token

if [ "$#" -gt 0 ]; then
  exec "$@"
fi
wait
