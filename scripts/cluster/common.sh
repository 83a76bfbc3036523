# Shared by up.sh and down.sh: where one cluster's state lives and what it is called.
# One cluster per state directory; its network namespace, veth and cgroup names carry the random
# id written there at start, so clusters of concurrent test runs never share a name.
# shellcheck shell=bash

CLUSTER_DIR=${SANDGATE_CLUSTER_DIR:-/var/lib/sandgate/cluster}
KUBECONFIG_PATH="$CLUSTER_DIR/admin.kubeconfig"
# The node's link to the namespace that starts it (the host, or a test's namespace), the Pods'
# and the Services' ranges: private, and routed nowhere but inside the node's namespace.
HOST_LINK_IP=10.231.0.1
NODE_IP=10.231.0.2
LINK_PREFIX=30
POD_CIDR=10.232.0.0/24
POD_GATEWAY=10.232.0.1
SERVICE_CIDR=10.233.0.0/24
SERVICE_IP=10.233.0.1
NODE_NAME=sandgate-node
# The programs, in start order; down.sh stops them in reverse.
DAEMONS=(etcd kube-apiserver containerd kube-controller-manager kube-scheduler kubelet)
# Host sysctls that kubelet sets when protectKernelDefaults is off (machine-wide, not per
# namespace): up.sh saves them first and down.sh puts them back.
KUBELET_SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
	kernel/keys/root_maxkeys kernel/keys/root_maxbytes)

cluster_id() { cat "$CLUSTER_DIR/id" 2>/dev/null; }
netns_name() { echo "sgk8s-$1"; }
host_veth() { echo "sgk8s-$1"; }
cgroup_name() { echo "sandgate-k8s-$1"; }

# Every cgroup v1 hierarchy (one per mount of type cgroup) and the v2 one, if mounted.
cgroup_hierarchies() {
	awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts
}

# More nodes (SANDGATE_CLUSTER_NODES=N, up.sh): node n = 2..N is a network namespace of its own
# with its own containerd and kubelet, joined to the API server of node 1 ("the node" above).
# Its link hangs off node 1 (node 1 routes between the host and it: no host sysctl changes), and
# its Pods get a /24 of their own. down.sh finds the nodes by their state dirs (nodes/<n>).
NODE_COUNT=${SANDGATE_CLUSTER_NODES:-1}
node_dir() { echo "$CLUSTER_DIR/nodes/$1"; }
node_name() { echo "$NODE_NAME-$1"; }
node_netns() { echo "sgk8s-$1-n$2"; }       # cluster id, node number
node_veth() { echo "sgk8s-n$1"; }           # node 1's end of node n's link (in node 1's netns)
link_ip() { echo "10.231.0.$((4 * ($1 - 1) + $2))"; } # node n's /30: .1 node 1's end, .2 node n's
node_pod_cidr() { echo "10.232.$(($1 - 1)).0/24"; }
node_pod_gateway() { echo "10.232.$(($1 - 1)).1"; }
extra_nodes() { ls "$CLUSTER_DIR/nodes" 2>/dev/null | sort -n; }
