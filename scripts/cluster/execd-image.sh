#!/usr/bin/env bash
# Build the execd image of the Kubernetes runtime from this checkout's Python and import it into
# the running cluster's containerd (lifecycle/runtime/kubernetes_execd.py says what it holds).
# `make cluster` runs it after up.sh; run it again after execd changed.
#
# Env: SANDGATE_CLUSTER_DIR (as up.sh), SANDGATE_EXECD_IMAGE (default sandgate.example.test/execd:1),
#      SANDGATE_EXECD_PYTHON (default this checkout's .venv/bin/python), PYTHON (for oci_image.py).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

IMAGE=${SANDGATE_EXECD_IMAGE:-sandgate.example.test/execd:1}
EXECD_PYTHON=${SANDGATE_EXECD_PYTHON:-$HERE/../../.venv/bin/python}
[[ -S $CLUSTER_DIR/containerd/containerd.sock ]] || {
	echo "execd-image: no running cluster in $CLUSTER_DIR (make cluster)" >&2
	exit 1
}
[[ -x $EXECD_PYTHON ]] || {
	echo "execd-image: no Python with sandgate at $EXECD_PYTHON (make bootstrap, or set SANDGATE_EXECD_PYTHON)" >&2
	exit 1
}
BIN=$(bash "$HERE/build.sh" --cached)
images="$CLUSTER_DIR/images"
mkdir -p "$images"
"$EXECD_PYTHON" -m sandgate.lifecycle.runtime.kubernetes_execd --strip-into "$images/execd-stripped" \
	>"$images/execd.json"
"${PYTHON:-python3}" "$HERE/oci_image.py" "$IMAGE" "$images/execd.tar" --files-from "$images/execd.json"
for socket in "$CLUSTER_DIR/containerd/containerd.sock" "$CLUSTER_DIR"/nodes/*/containerd/containerd.sock; do
	[[ -S $socket ]] || continue # every node's containerd (SANDGATE_CLUSTER_NODES)
	"$BIN/ctr" --address "$socket" --namespace k8s.io images import "$images/execd.tar" >>"$CLUSTER_DIR/logs/ctr.log" 2>&1
done
rm -r "$images/execd.tar" "$images/execd-stripped"
echo "execd-image: imported $IMAGE" >&2
