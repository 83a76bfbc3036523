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

# execd's token goes to execd alone, in its environment (never argv: the host's process list
# shows container processes); execd keeps it from the commands it runs, and the entrypoint
# below never sees it. -I -S: no site, no .pth processing (execd needs neither, and start-up
# is the sandbox's time to ready); execd's site-packages goes on sys.path by hand instead.
token="${SANDGATE_EXECD_TOKEN:-}"
unset SANDGATE_EXECD_TOKEN
for site in /usr/local/lib/python3*/site-packages; do :; done
EXECD_ACCESS_TOKEN="$token" python3 -I -S -c \
  'import sys; sys.path.insert(0, sys.argv.pop(1)); from sandgate.execd.__main__ import main; main()' \
  "$site" --host "$SANDGATE_ADDRESS" --port "$port" &
unset token

if [ "$#" -gt 0 ]; then
  exec "$@"
fi
wait
