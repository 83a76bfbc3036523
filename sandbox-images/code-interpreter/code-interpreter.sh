#!/bin/sh
# The entrypoint of opensandbox/code-interpreter, as OpenSandbox's SDK documents it: Jupyter
# Server on 127.0.0.1:${JUPYTER_PORT:-44771} (the port CodeInterpreter.create probes). execd runs
# the code contexts on this image's kernels (/usr/local/share/jupyter/kernels).
# PYTHON_VERSION (and JAVA_VERSION, NODE_VERSION, GO_VERSION) pick versions in OpenSandbox's
# image; this one has one Python, and says so when another is asked for.
set -eu

have=$(python3 -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
case "${PYTHON_VERSION:-}" in
  "" | "${have%.*}" | "$have") echo "code-interpreter: Python $have" >&2 ;;
  *) echo "code-interpreter: PYTHON_VERSION=$PYTHON_VERSION asked, but this image has Python $have only; using $have" >&2 ;;
esac
for asked in JAVA_VERSION NODE_VERSION GO_VERSION; do
  eval "value=\${$asked:-}"
  if [ -n "$value" ]; then
    echo "code-interpreter: $asked=$value asked; this image has no such runtime (JavaScript/TypeScript run on Deno $(deno --version | head -n 1 | cut -d' ' -f2))" >&2
  fi
done

mkdir -p "$HOME" 2>/dev/null || true
exec python3 -m jupyter_server --ip=127.0.0.1 --port="${JUPYTER_PORT:-44771}" --no-browser --allow-root \
  --ServerApp.root_dir=/workspace
