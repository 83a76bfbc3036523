#!/usr/bin/env bash
# Build the one-node cluster's programs once per version set and print the directory that holds
# them: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl (k8s.io/kubernetes),
# the etcd server (go.etcd.io/etcd/server/v3), containerd, containerd-shim-runc-v2
# and ctr (containerd v2), and a static pause program. The versions are the go.mod files beside this
# script; the cache key is those versions, so a second run (or a second worktree) only prints the path.
#
# Built under `nice -n 10` (the machine is shared), CGO off as upstream builds its static binaries,
# stripped (-s -w: about a third smaller, and the cache is per version anyway). The result lands in
# a temporary directory renamed into place at the end, so an interrupted build leaves no half cache.
# docs/kubernetes.md has the cold and warm costs.
#
# Usage: scripts/cluster/build.sh            -> prints the bin directory
#        scripts/cluster/build.sh --cached   -> prints it if built, else fails (builds nothing)
# Env:   SANDGATE_K8S_CACHE (default ~/.cache/sandgate/k8s)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

module_version() { # the version that the go.mod in $1 selects of module $2
	(cd "$HERE/$1" && go list -m -f '{{.Version}}' "$2")
}

K8S_VERSION=$(module_version kubernetes k8s.io/kubernetes)
ETCD_VERSION=$(module_version etcd go.etcd.io/etcd/server/v3)
CONTAINERD_VERSION=$(module_version containerd github.com/containerd/containerd/v2)
CACHE=${SANDGATE_K8S_CACHE:-$HOME/.cache/sandgate/k8s}
KEY="kubernetes-$K8S_VERSION-etcd-$ETCD_VERSION-containerd-$CONTAINERD_VERSION"
BIN="$CACHE/$KEY/bin"

if [[ -x "$BIN/kubelet" ]]; then
	echo "$BIN"
	exit 0
fi
if [[ ${1:-} == --cached ]]; then
	echo "cluster: not built yet: $BIN" >&2
	exit 1
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/$KEY.lock"
flock 9 # a concurrent build of the same key waits for this one and then finds its result
if [[ -x "$BIN/kubelet" ]]; then
	echo "$BIN"
	exit 0
fi

STAGE=$(mktemp -d "$CACHE/$KEY.build.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false"

build() { # module-dir output ldflags package...
	local dir=$1 output=$2 ldflags=$3
	shift 3
	echo "building $* ..." >&2
	(cd "$HERE/$dir" && nice -n 10 go build -o "$output" -ldflags "-s -w $ldflags" "$@") >&2
}

minor=${K8S_VERSION#v1.}
minor=${minor%%.*}
version_pkg=k8s.io/component-base/version
build kubernetes "$STAGE/bin/" "-X $version_pkg.gitVersion=$K8S_VERSION -X $version_pkg.gitMajor=1 -X $version_pkg.gitMinor=$minor \
-X $version_pkg.gitTreeState=clean -X $version_pkg.buildDate=1970-01-01T00:00:00Z" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl
build etcd "$STAGE/bin/etcd" "-X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" go.etcd.io/etcd/server/v3
build containerd "$STAGE/bin/" "-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" -tags no_btrfs \
	github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
	github.com/containerd/containerd/v2/cmd/ctr
echo "building pause ..." >&2
nice -n 10 cc -static -Os -o "$STAGE/bin/pause" "$HERE/pause.c" >&2

mkdir -p "$CACHE/$KEY"
mv "$STAGE/bin" "$BIN"
echo "$BIN"
