#!/usr/bin/env bash
# Remove the cluster of up.sh (`make cluster-down`), all of it, also after a start that failed
# half way, every node of it (nodes 2..N: their kubelets first, their containerds with node 1's):
# its processes, mounts, network namespace (with the veths, bridge and nft table in it),
# cgroups, the host sysctls kubelet changed, what containerd keeps at fixed paths (shim sockets,
# CNI result cache), and the state directory.
#
# Order: kubelet and the controllers first (nothing restarts a Pod), then containerd deletes its
# sandboxes and tasks, then the daemons stop. Whatever still runs in the cluster's cgroup after
# that (a Pod's shim) is stopped by PID from the cgroup's own list, never by name: TERM, then KILL
# (reported). Safe to run again.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

ID=$(cluster_id || true)
if [[ -z $ID ]]; then
	[[ -d $CLUSTER_DIR ]] && rm -rf "$CLUSTER_DIR"
	echo "cluster: nothing to remove at $CLUSTER_DIR"
	exit 0
fi
NETNS=$(netns_name "$ID")
CGROUP=$(cgroup_name "$ID")
SOCKET="$CLUSTER_DIR/containerd/containerd.sock"

# The PID in pids/NAME, if that process still runs in the cluster's cgroup (not a reused PID).
daemon_pid() {
	local pid
	pid=$(cat "$CLUSTER_DIR/pids/$1" 2>/dev/null) || return 1
	grep -q "/$CGROUP/" "/proc/$pid/cgroup" 2>/dev/null && echo "$pid"
}

# Bounded wait for PIDs to be gone: wait_gone SECONDS PID...
wait_gone() {
	local deadline=$((SECONDS + $1)) pid
	shift
	for pid in "$@"; do
		while kill -0 "$pid" 2>/dev/null; do
			((SECONDS < deadline)) || return 1
			sleep 0.2
		done
	done
}

stop_daemon() {
	local pid
	pid=$(daemon_pid "$1") || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	if ! wait_gone 30 "$pid"; then
		echo "cluster: $1 ($pid) ignored SIGTERM for 30s; killing it" >&2
		kill -KILL "$pid" 2>/dev/null || true
		wait_gone 10 "$pid" || true
	fi
}

# delete_tasks DAEMON SOCKET: through containerd's own API, remove every Pod sandbox (its
# controller stops the sandbox and shuts its shim down; a Pod's shim outlives its tasks until
# then), then kill and delete every task and container left.
delete_tasks() {
	daemon_pid "$1" >/dev/null || return 0
	local bin ctr id
	bin=$(dirname "$(readlink "/proc/$(daemon_pid "$1")/exe")")
	ctr=("$bin/ctr" --address "$2" --namespace k8s.io --timeout 20s)
	for id in $("${ctr[@]}" sandboxes list 2>/dev/null | awk 'NR > 1 { print $1 }'); do
		"${ctr[@]}" sandboxes remove --force "$id" >/dev/null 2>&1 || true
	done
	for id in $("${ctr[@]}" containers list --quiet 2>/dev/null); do
		"${ctr[@]}" tasks kill --signal SIGKILL "$id" >/dev/null 2>&1 || true
		"${ctr[@]}" tasks delete --force "$id" >/dev/null 2>&1 || true
		"${ctr[@]}" containers delete "$id" >/dev/null 2>&1 || true
	done
}

# The hostPath provisioner's directories of the cluster's PersistentVolumes (up.sh
# make_storage_class), outside the state directory; only while the API server answers.
remove_provisioned_volumes() {
	daemon_pid kube-apiserver >/dev/null && [[ -f $CLUSTER_DIR/admin.kubeconfig ]] || return 0
	local kubectl path
	kubectl="$(dirname "$(readlink "/proc/$(daemon_pid kube-apiserver)/exe")")/kubectl"
	for path in $("$kubectl" --kubeconfig "$CLUSTER_DIR/admin.kubeconfig" --request-timeout 20s get pv \
		-o jsonpath='{range .items[*]}{.spec.hostPath.path}{"\n"}{end}'); do
		if [[ $path == /tmp/hostpath_pv/* ]]; then rm -rf "$path"; fi
	done
	rmdir /tmp/hostpath_pv 2>/dev/null || true # the provisioner's parent, unless another cluster uses it
}

cgroup_pids() {
	local hierarchy
	for hierarchy in $(cgroup_hierarchies); do
		[[ -d $hierarchy/$CGROUP ]] && find "$hierarchy/$CGROUP" -name cgroup.procs -exec cat {} +
	done | sort -un
}

# What is still in the cluster's cgroups (a Pod's shim can outlive its sandbox's removal): TERM,
# and KILL what has not exited 10 s later (which is reported).
stop_leftovers() {
	local pids
	mapfile -t pids < <(cgroup_pids)
	((${#pids[@]})) || return 0
	kill -TERM "${pids[@]}" 2>/dev/null || true
	wait_gone 10 "${pids[@]}" && return 0
	mapfile -t pids < <(cgroup_pids)
	echo "cluster: killing ${#pids[@]} process(es) left in cgroup $CGROUP:" >&2
	ps -o pid=,stat=,args= -p "$(IFS=,; echo "${pids[*]}")" >&2 || true
	kill -KILL "${pids[@]}" 2>/dev/null || true
	wait_gone 20 "${pids[@]}" || echo "cluster: some of ${pids[*]} did not exit" >&2
}

# "<socket> <id>" for the containers and Pod sandboxes each node's containerd knows, read
# before anything stops.
container_ids() {
	local root dir
	for root in "$CLUSTER_DIR/containerd" $(for n in $(extra_nodes); do echo "$(node_dir "$n")/containerd"; done); do
		for dir in "$root/state/io.containerd.runtime.v2.task/k8s.io" "$root/root/io.containerd.grpc.v1.cri/sandboxes" \
			"$root/root/io.containerd.grpc.v1.cri/containers"; do
			[[ -d $dir ]] && ls "$dir"
		done | sort -u | sed "s|^|$root/containerd.sock |"
	done
}

# What containerd keeps outside the state directory, at fixed paths, per container or sandbox:
# a shim's socket, /run/containerd/s/<sha256 of "<containerd socket>/<namespace>/<id>"> (a killed
# shim leaves it), and libcni's cached result per sandbox and interface, /var/lib/cni/results/
# <network>-<id>-<ifname> (a sandbox that was never stopped through the CRI leaves them).
remove_outside_state() {
	local entry socket id digest
	for entry in "$@"; do
		read -r socket id <<<"$entry"
		digest=$(printf '%s' "$socket/k8s.io/$id" | sha256sum | cut -d' ' -f1)
		rm -f "/run/containerd/s/$digest" /var/lib/cni/results/*-"$id"-*
	done
}

# Every mount at or under the state directory, deepest first (overlay rootfs, Pod volumes,
# Pods' network namespaces, shm).
unmount_all() {
	local mount_point
	awk -v dir="$CLUSTER_DIR" '$5 == dir || index($5, dir "/") == 1 { print length($5), $5 }' /proc/self/mountinfo |
		sort -rn | cut -d' ' -f2- | while read -r mount_point; do
		umount "$mount_point" 2>/dev/null || umount -l "$mount_point"
	done
}

remove_cgroups() {
	local hierarchy status=0
	for hierarchy in $(cgroup_hierarchies); do
		if [[ -d $hierarchy/$CGROUP ]]; then
			find "$hierarchy/$CGROUP" -depth -type d -exec rmdir {} + || status=1
		fi
	done
	return "$status"
}

# The veth first (both ends go at once): a namespace's own devices go some time after it. Nodes
# 2..N first (their links end in node 1; the host's routes to them go with node 1's veth).
remove_network() {
	local n netns
	for n in $(extra_nodes); do
		netns=$(node_netns "$ID" "$n")
		if [[ -e /run/netns/$NETNS ]]; then ip -n "$NETNS" link del "$(node_veth "$n")" 2>/dev/null || true; fi
		if [[ -e /run/netns/$netns ]]; then ip netns del "$netns"; fi
	done
	if ip link show "$(host_veth "$ID")" >/dev/null 2>&1; then ip link del "$(host_veth "$ID")"; fi
	if [[ -e /run/netns/$NETNS ]]; then ip netns del "$NETNS"; fi
}

restore_sysctls() {
	local key value
	[[ -f $CLUSTER_DIR/sysctls ]] || return 0
	while read -r key value; do
		[[ $(cat "/proc/sys/$key") == "$value" ]] || echo "$value" >"/proc/sys/$key"
	done <"$CLUSTER_DIR/sysctls"
}

# Every step runs even when one before it failed (a half-made cluster has parts missing); the
# exit status says whether all went well.
failed=0
step() {
	"$@" || {
		echo "cluster: $1 failed" >&2
		failed=1
	}
}

mapfile -t ids < <(container_ids)
mapfile -t nodes < <(extra_nodes)
for node in "${nodes[@]}"; do step stop_daemon "kubelet-$node"; done
for daemon in kubelet kube-scheduler kube-controller-manager; do step stop_daemon "$daemon"; done
for node in "${nodes[@]}"; do
	step delete_tasks "containerd-$node" "$(node_dir "$node")/containerd/containerd.sock"
	step stop_daemon "containerd-$node"
done
step delete_tasks containerd "$SOCKET"
step remove_provisioned_volumes
for daemon in containerd kube-apiserver etcd; do step stop_daemon "$daemon"; done
step stop_leftovers
step remove_outside_state "${ids[@]}"
step unmount_all
step remove_cgroups
step remove_network
step restore_sysctls
if ((failed)); then
	echo "cluster: left $CLUSTER_DIR in place, see the errors above; run again to retry" >&2
	exit 1
fi
rm -rf "$CLUSTER_DIR"
echo "cluster: removed $NETNS and $CLUSTER_DIR"
