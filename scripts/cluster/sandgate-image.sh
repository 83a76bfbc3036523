#!/usr/bin/env bash
# Build the sandgate image (the server and the node agent: deploy/) from this checkout's Python
# and the installed sandgate (scripts/cluster/sandgate_image.py says what it holds) and import it
# into every node's containerd of the running cluster. Nothing is pulled.
#
# Env: SANDGATE_CLUSTER_DIR (as up.sh), SANDGATE_IMAGE_NAME (default sandgate.example.test/sandgate:1),
#      SANDGATE_IMAGE_PYTHON (default this checkout's .venv/bin/python), PYTHON (for oci_image.py),
#      SANDGATE_IMAGE_OUT (keep the archive there, for another cluster's nodes or a registry).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

IMAGE=${SANDGATE_IMAGE_NAME:-sandgate.example.test/sandgate:1}
SANDGATE_UID=10001 # deploy/server.yaml's runAsUser
IMAGE_PYTHON=${SANDGATE_IMAGE_PYTHON:-$HERE/../../.venv/bin/python}
[[ -S $CLUSTER_DIR/containerd/containerd.sock ]] || {
	echo "sandgate-image: no running cluster in $CLUSTER_DIR (make cluster)" >&2
	exit 1
}
BIN=$(bash "$HERE/build.sh" --cached)
images="$CLUSTER_DIR/images"
archive=${SANDGATE_IMAGE_OUT:-$images/sandgate.tar}
mkdir -p "$images"
"$IMAGE_PYTHON" "$HERE/sandgate_image.py" >"$images/sandgate.json"
# The image's user is `sandgate` (10001), not root: the server needs no privilege. The node agent
# runs as root (runAsUser: 0 in deploy/node-proxy.yaml): its nft walls need NET_ADMIN in the
# node's network namespace, which a capability added to a non-root user does not give.
printf 'root:x:0:0:root:/root:/sbin/nologin\nsandgate:x:%s:%s:sandgate:/var/lib/sandgate:/sbin/nologin\n' \
	"$SANDGATE_UID" "$SANDGATE_UID" >"$images/passwd"
printf 'root:x:0:\nsandgate:x:%s:\n' "$SANDGATE_UID" >"$images/group"
"${PYTHON:-python3}" "$HERE/oci_image.py" "$IMAGE" "$archive" --files-from "$images/sandgate.json" \
	--file "/etc/passwd=$images/passwd" --file "/etc/group=$images/group" --user "$SANDGATE_UID:$SANDGATE_UID" \
	--entrypoint=/usr/local/bin/python3 --entrypoint=-m --entrypoint=sandgate.lifecycle.cli
for socket in "$CLUSTER_DIR/containerd/containerd.sock" "$CLUSTER_DIR"/nodes/*/containerd/containerd.sock; do
	[[ -S $socket ]] || continue # every node's containerd (SANDGATE_CLUSTER_NODES)
	"$BIN/ctr" --address "$socket" --namespace k8s.io images import "$archive" >>"$CLUSTER_DIR/logs/ctr.log" 2>&1
done
[[ -n ${SANDGATE_IMAGE_OUT:-} ]] || rm "$archive"
echo "sandgate-image: imported $IMAGE" >&2
