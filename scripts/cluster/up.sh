#!/usr/bin/env bash
# Start a one-node Kubernetes cluster on this machine (`make cluster`) and print its kubeconfig.
#
# Theory (docs/kubernetes.md has the whole picture):
# - Every part runs in one network namespace of its own, "the node" (sgk8s-<id>): etcd, the API
#   server, controller-manager, scheduler, containerd, kubelet, and behind a bridge the Pods. The
#   node has no default route: it reaches only the namespace that started it (the host, or a
#   test's namespace) over one veth, where the API server answers at https://NODE_IP:6443. Pods'
#   new connections out of the node are dropped, so a Pod reaches nothing beyond its node.
# - Every process runs in a cgroup of its own (sandgate-k8s-<id>) in every hierarchy, and kubelet
#   puts the Pods under it (cgroupRoot): down.sh finds every process of the cluster there.
# - Nothing is pulled: the pause image and a busybox test image are built from local files and
#   imported; containerd pins the pause image and Pods use imagePullPolicy Never.
# - A start that fails shows the logs' tails and tears everything down again (down.sh), unless
#   SANDGATE_CLUSTER_KEEP_ON_FAILURE=1.
#
# - SANDGATE_CLUSTER_NODES=N adds nodes 2..N (add_node): each its own network namespace,
#   containerd and kubelet, linked to node 1, which runs the control plane.
#
# Env: SANDGATE_CLUSTER_DIR (state; default /var/lib/sandgate/cluster), SANDGATE_K8S_CACHE (build.sh),
#      SANDGATE_CLUSTER_NODES (default 1), PYTHON (for oci_image.py; default python3),
#      SANDGATE_CLUSTER_MIRROR (http(s)://host:port: the node pulls docker.io images from this
#      mirror only; more in containerd/certs.d, see below).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

PAUSE_IMAGE=sandgate.example.test/pause:1
BUSYBOX_IMAGE=sandgate.example.test/busybox:1
BUSYBOX=/bin/busybox

if [[ $(id -u) -ne 0 ]]; then
	echo "cluster: needs root (network namespace, cgroups, containerd, kubelet)" >&2
	exit 1
fi
if [[ -f $CLUSTER_DIR/id ]]; then
	if [[ -f $CLUSTER_DIR/pids/kubelet ]] && kill -0 "$(cat "$CLUSTER_DIR/pids/kubelet")" 2>/dev/null; then
		echo "$KUBECONFIG_PATH"
		exit 0
	fi
	echo "cluster: $CLUSTER_DIR holds a cluster that is not running; run 'make cluster-down' first" >&2
	exit 1
fi
for program in runc nft ip nsenter openssl curl "$BUSYBOX" /usr/lib/cni/bridge /usr/lib/cni/host-local \
	/usr/lib/cni/loopback; do
	command -v "$program" >/dev/null || {
		echo "cluster: $program is missing (make cluster installs it: scripts/bootstrap.sh cluster)" >&2
		exit 1
	}
done

BIN=$(bash "$HERE/build.sh")
ID=$(openssl rand -hex 3)
NETNS=$(netns_name "$ID")
CGROUP=$(cgroup_name "$ID")
mkdir -p "$CLUSTER_DIR"/{pids,logs,pki,images,etcd,kubelet,cni/net.d,containerd,runc}
echo "$ID" >"$CLUSTER_DIR/id"

on_failure() {
	local status=$? daemon
	((status != 0)) || return 0
	echo "cluster: start failed; the last lines of each log:" >&2
	for daemon in "${DAEMONS[@]}" containerd-{2..9} kubelet-{2..9}; do
		[[ -f $CLUSTER_DIR/logs/$daemon.log ]] || continue
		echo "--- $daemon" >&2
		tail -n 15 "$CLUSTER_DIR/logs/$daemon.log" >&2
	done
	if [[ ${SANDGATE_CLUSTER_KEEP_ON_FAILURE:-} != 1 ]]; then
		bash "$HERE/down.sh" >&2 || true
	fi
}
trap on_failure EXIT

# Bounded wait for a command to succeed: wait_for WHAT SECONDS COMMAND...
wait_for() {
	local what=$1 deadline=$((SECONDS + $2))
	shift 2
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= deadline)); then
			echo "cluster: $what not ready after ${deadline}s" >&2
			return 1
		fi
		sleep 0.5
	done
}

in_node() { nsenter --net="/run/netns/$NETNS" "$@"; }

save_sysctls() {
	local key
	for key in "${KUBELET_SYSCTLS[@]}"; do echo "$key $(cat "/proc/sys/$key")"; done >"$CLUSTER_DIR/sysctls"
}

make_network() {
	local veth
	veth=$(host_veth "$ID")
	ip netns add "$NETNS"
	ip link add "$veth" type veth peer name eth0 netns "$NETNS"
	ip addr add "$HOST_LINK_IP/$LINK_PREFIX" dev "$veth"
	ip link set "$veth" up
	in_node ip link set lo up
	in_node ip addr add "$NODE_IP/$LINK_PREFIX" dev eth0
	in_node ip link set eth0 up
	# The host reaches Pods (the runtime's server talks to execd in them); nothing else is routed.
	ip route add "$POD_CIDR" via "$NODE_IP" dev "$veth"
	wall_pods "$NETNS" "$POD_CIDR"
}

# wall_pods NETNS POD_CIDR: the node forwards no new connection from its Pods out of its link.
wall_pods() {
	nsenter --net="/run/netns/$1" nft -f - <<-EOF
		table inet sandgate_cluster {
			chain forward {
				type filter hook forward priority filter; policy accept;
				ip saddr $2 oifname "eth0" ct state new counter drop
			}
		}
	EOF
}

# make_cgroups [SUBDIR...]: the cluster's cgroup and its system/ (or the SUBDIRs of it given).
make_cgroups() {
	local hierarchy dir sub subs=("$@")
	((${#subs[@]})) || subs=("" system)
	for hierarchy in $(cgroup_hierarchies); do
		for sub in "${subs[@]}"; do
			dir="$hierarchy/$CGROUP${sub:+/$sub}"
			mkdir -p "$dir"
			# a v1 cpuset cgroup starts with no CPU and no memory node: inherit the parent's
			if [[ -f $dir/cpuset.cpus ]]; then
				cat "$(dirname "$dir")/cpuset.cpus" >"$dir/cpuset.cpus"
				cat "$(dirname "$dir")/cpuset.mems" >"$dir/cpuset.mems"
			fi
		done
	done
}

# One certificate signed by the cluster CA: sign NAME SUBJECT [SUBJECT_ALT_NAMES]
sign() {
	local name=$1 subject=$2 sans=${3:-} pki="$CLUSTER_DIR/pki"
	openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subject" -out "$pki/$name.csr" 2>/dev/null
	local extensions="$pki/$name.ext"
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "subjectKeyIdentifier=hash"
		echo "authorityKeyIdentifier=keyid,issuer"
		if [[ -n $sans ]]; then
			echo "extendedKeyUsage=serverAuth"
			echo "subjectAltName=$sans"
		else
			echo "extendedKeyUsage=clientAuth"
		fi
	} >"$extensions"
	openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 365 \
		-extfile "$extensions" -out "$pki/$name.crt" 2>/dev/null
	rm "$pki/$name.csr" "$extensions"
}

make_pki() {
	local pki="$CLUSTER_DIR/pki"
	# key usage and key identifiers: Python's ssl verifies strictly (VERIFY_X509_STRICT)
	openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 365 \
		-subj "/CN=sandgate-cluster-ca" -addext "basicConstraints=critical,CA:TRUE" \
		-addext "keyUsage=critical,keyCertSign,cRLSign" -addext "subjectKeyIdentifier=hash" 2>/dev/null
	sign apiserver "/CN=kube-apiserver" \
		"IP:$NODE_IP,IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
	sign admin "/O=system:masters/CN=sandgate-admin"
	sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
	sign controller-manager "/CN=system:kube-controller-manager"
	sign scheduler "/CN=system:kube-scheduler"
	sign kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"
	openssl genrsa -out "$pki/service-account.key" 2048 2>/dev/null
	openssl rsa -in "$pki/service-account.key" -pubout -out "$pki/service-account.pub" 2>/dev/null
}

# kubeconfig NAME SERVER: a kubeconfig for the client certificate NAME
kubeconfig() {
	local name=$1 server=$2 pki="$CLUSTER_DIR/pki"
	cat >"$CLUSTER_DIR/$name.kubeconfig" <<-EOF
		apiVersion: v1
		kind: Config
		clusters:
		- name: sandgate
		  cluster:
		    server: $server
		    certificate-authority: $pki/ca.crt
		users:
		- name: $name
		  user:
		    client-certificate: $pki/$name.crt
		    client-key: $pki/$name.key
		contexts:
		- name: sandgate
		  context: {cluster: sandgate, user: $name, namespace: default}
		current-context: sandgate
	EOF
}

write_configs() {
	local pki="$CLUSTER_DIR/pki"
	kubeconfig admin "https://$NODE_IP:6443"
	for name in controller-manager scheduler kubelet; do kubeconfig "$name" "https://127.0.0.1:6443"; done
	cat >"$CLUSTER_DIR/cni/net.d/10-sandgate.conflist" <<-EOF
		{
		  "cniVersion": "1.0.0",
		  "name": "sandgate-pods",
		  "plugins": [
		    {"type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true, "ipMasq": false,
		     "hairpinMode": true,
		     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
		              "dataDir": "$CLUSTER_DIR/cni/ipam"}},
		    {"type": "loopback"}
		  ]
		}
	EOF
	cat >"$CLUSTER_DIR/containerd/config.toml" <<-EOF
		version = 3
		root = "$CLUSTER_DIR/containerd/root"
		state = "$CLUSTER_DIR/containerd/state"
		[grpc]
		  address = "$CLUSTER_DIR/containerd/containerd.sock"
		[ttrpc]
		  address = "$CLUSTER_DIR/containerd/containerd.sock.ttrpc"
		[plugins.'io.containerd.internal.v1.opt']
		  path = "$CLUSTER_DIR/containerd/opt"
		[plugins.'io.containerd.nri.v1.nri']
		  disable = true
		[plugins.'io.containerd.grpc.v1.cri']
		  stream_server_address = "127.0.0.1"
		[plugins.'io.containerd.cri.v1.images']
		  snapshotter = "overlayfs"
		  [plugins.'io.containerd.cri.v1.images'.registry]
		    # one hosts.toml per registry name, read at each pull (write_registry_hosts)
		    config_path = "$CLUSTER_DIR/containerd/certs.d"
		  [plugins.'io.containerd.cri.v1.images'.pinned_images]
		    sandbox = "$PAUSE_IMAGE"
		[plugins.'io.containerd.cri.v1.runtime']
		  netns_mounts_under_state_dir = true
		  # no CAP_SYS_RESOURCE here: runc cannot lower a container's OOM score below containerd's
		  restrict_oom_score_adj = true
		  enable_unprivileged_ports = false
		  enable_unprivileged_icmp = false
		  [plugins.'io.containerd.cri.v1.runtime'.cni]
		    bin_dirs = ["/usr/lib/cni"]
		    conf_dir = "$CLUSTER_DIR/cni/net.d"
		  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
		    runtime_type = "io.containerd.runc.v2"
		    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
		      BinaryName = "$(command -v runc)"
		      Root = "$CLUSTER_DIR/runc"
		      SystemdCgroup = false
	EOF
	: >"$CLUSTER_DIR/resolv.conf" # Pods get no resolver: the node has none to give them
	# Containers' logs in the state dir, not the machine-wide /var/log/pods: another cluster's
	# kubelet there would remove this one's Pod log directories as orphans of its own.
	cat >"$CLUSTER_DIR/kubelet/config.yaml" <<-EOF
		apiVersion: kubelet.config.k8s.io/v1beta1
		kind: KubeletConfiguration
		address: $NODE_IP
		readOnlyPort: 0
		healthzBindAddress: 127.0.0.1
		authentication:
		  anonymous: {enabled: false}
		  webhook: {enabled: true}
		  x509: {clientCAFile: $pki/ca.crt}
		authorization: {mode: Webhook}
		containerRuntimeEndpoint: unix://$CLUSTER_DIR/containerd/containerd.sock
		cgroupDriver: cgroupfs
		cgroupRoot: /$CGROUP
		failCgroupV1: false
		failSwapOn: false
		resolvConf: $CLUSTER_DIR/resolv.conf
		podLogsDir: $CLUSTER_DIR/pod-logs
		imageGCHighThresholdPercent: 100
		imageGCLowThresholdPercent: 99
		evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
		serializeImagePulls: false
		podPidsLimit: 1024
		registerWithTaints: []
	EOF
}

# The node's registries: containerd reads certs.d/<registry>/hosts.toml at each pull. With
# SANDGATE_CLUSTER_MIRROR, docker.io names resolve at that mirror and nowhere else (its `server`
# is the mirror too, so containerd never falls back to the public name). A test's registry
# listens on plain HTTP inside the test's network; a registry named by its own host:port needs
# a hosts.toml of its own, which the test writes the same way.
write_registry_hosts() {
	mkdir -p "$CLUSTER_DIR/containerd/certs.d"
	[[ -n ${SANDGATE_CLUSTER_MIRROR:-} ]] || return 0
	mkdir -p "$CLUSTER_DIR/containerd/certs.d/docker.io"
	cat >"$CLUSTER_DIR/containerd/certs.d/docker.io/hosts.toml" <<-EOF
		server = "$SANDGATE_CLUSTER_MIRROR"
		[host."$SANDGATE_CLUSTER_MIRROR"]
		  capabilities = ["pull", "resolve"]
	EOF
}

make_images() {
	local images="$CLUSTER_DIR/images" python=${PYTHON:-python3}
	"$python" "$HERE/oci_image.py" "$PAUSE_IMAGE" "$images/pause.tar" --file "/pause=$BIN/pause" --entrypoint /pause
	"$python" "$HERE/oci_image.py" "$BUSYBOX_IMAGE" "$images/busybox.tar" --file "/bin/busybox=$BUSYBOX" \
		--file "/bin/sh=$BUSYBOX" --entrypoint /bin/busybox
}

# start NAME PROGRAM ARGS...: in the node's namespace and the cluster's cgroup, PID in pids/NAME.
start() {
	local name=$1
	shift
	# The subshell moves itself into the cgroup, then execs: the PID it had is the daemon's.
	(
		for hierarchy in $(cgroup_hierarchies); do echo "$BASHPID" >"$hierarchy/$CGROUP/system/cgroup.procs"; done
		PATH="$BIN:$PATH" exec nsenter --net="/run/netns/${START_NETNS:-$NETNS}" "$@"
	) </dev/null >"$CLUSTER_DIR/logs/$name.log" 2>&1 &
	echo $! >"$CLUSTER_DIR/pids/$name"
}

api_ready() {
	local pki="$CLUSTER_DIR/pki"
	in_node curl -sf --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
		"https://127.0.0.1:6443/readyz"
}

kubectl() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }
ctr() { "$BIN/ctr" --address "$CLUSTER_DIR/containerd/containerd.sock" --namespace k8s.io "$@"; }

start_daemons() {
	local pki="$CLUSTER_DIR/pki"
	start etcd "$BIN/etcd" --name node --data-dir "$CLUSTER_DIR/etcd" \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster node=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381
	wait_for etcd 60 in_node curl -sf http://127.0.0.1:2381/health
	start kube-apiserver "$BIN/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
		--bind-address 0.0.0.0 --secure-port 6443 --advertise-address "$NODE_IP" \
		--tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
		--client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC \
		--kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$pki/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types InternalIP \
		--service-account-key-file "$pki/service-account.pub" \
		--service-account-signing-key-file "$pki/service-account.key" \
		--service-account-issuer https://kubernetes.default.svc \
		--service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=false
	start containerd "$BIN/containerd" --config "$CLUSTER_DIR/containerd/config.toml"
	wait_for containerd 60 ctr version
	local image
	for image in pause busybox; do
		ctr images import "$CLUSTER_DIR/images/$image.tar" >>"$CLUSTER_DIR/logs/ctr.log" 2>&1
	done
	wait_for kube-apiserver 120 api_ready
	start kube-controller-manager "$BIN/kube-controller-manager" \
		--kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" --bind-address 127.0.0.1 \
		--leader-elect=false --use-service-account-credentials \
		--service-account-private-key-file "$pki/service-account.key" --root-ca-file "$pki/ca.crt" \
		--enable-hostpath-provisioner \
		--authentication-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
		--authorization-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig"
	start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false \
		--authentication-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
		--authorization-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig"
	start kubelet "$BIN/kubelet" --config "$CLUSTER_DIR/kubelet/config.yaml" \
		--kubeconfig "$CLUSTER_DIR/kubelet.kubeconfig" --root-dir "$CLUSTER_DIR/kubelet" \
		--cert-dir "$CLUSTER_DIR/kubelet/pki" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP"
	wait_for "node $NODE_NAME" 180 kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=5s
	# a Pod is admitted only once its namespace's service account exists (controller-manager)
	wait_for "service account default" 60 kubectl get serviceaccount default
	make_storage_class
}

# The cluster's default StorageClass, for PersistentVolumeClaims (sandgate's `pvc` volumes):
# kube-controller-manager's own hostPath provisioner (a directory /tmp/hostpath_pv/<uuid> per
# claim, removed with the claim; no size cap). Only for a cluster on one machine, whose nodes
# share the filesystem: down.sh removes what is left of them.
make_storage_class() {
	kubectl apply -f - >/dev/null <<-EOF
		apiVersion: storage.k8s.io/v1
		kind: StorageClass
		metadata:
		  name: sandgate-local
		  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
		provisioner: kubernetes.io/host-path
		reclaimPolicy: Delete
		volumeBindingMode: Immediate
	EOF
}

# Node n (2..NODE_COUNT): a network namespace linked to node 1 (which routes between it and the
# host), its own containerd, CNI range and kubelet (cgroupRoot under the cluster's cgroup), the
# same images and walls; node 1's files with this node's paths and addresses.
add_node() {
	local n=$1 dir netns veth peer ip cidr name
	dir=$(node_dir "$n") netns=$(node_netns "$ID" "$n") veth=$(node_veth "$n") name=$(node_name "$n")
	peer=$(link_ip "$n" 1) ip=$(link_ip "$n" 2) cidr=$(node_pod_cidr "$n")
	mkdir -p "$dir"/{kubelet,cni/net.d,containerd,runc}
	ip netns add "$netns"
	in_node ip link add "$veth" type veth peer name eth0 netns "$netns"
	in_node ip addr add "$peer/$LINK_PREFIX" dev "$veth"
	in_node ip link set "$veth" up
	in_node sysctl -qw net.ipv4.ip_forward=1
	in_node ip route add "$cidr" via "$ip" dev "$veth"
	nsenter --net="/run/netns/$netns" ip link set lo up
	nsenter --net="/run/netns/$netns" ip addr add "$ip/$LINK_PREFIX" dev eth0
	nsenter --net="/run/netns/$netns" ip link set eth0 up
	nsenter --net="/run/netns/$netns" ip route add "$(link_ip 1 0)/$LINK_PREFIX" via "$peer"
	ip route add "$(link_ip "$n" 0)/$LINK_PREFIX" via "$NODE_IP"
	ip route add "$cidr" via "$NODE_IP"
	wall_pods "$netns" "$cidr"
	make_cgroups "node-$n"
	sign "kubelet-$n" "/O=system:nodes/CN=system:node:$name"
	kubeconfig "kubelet-$n" "https://$NODE_IP:6443"
	sed -e "s|$CLUSTER_DIR/cni/ipam|$dir/cni/ipam|" -e "s|\"$POD_CIDR\"|\"$cidr\"|" \
		-e "s|\"$POD_GATEWAY\"|\"$(node_pod_gateway "$n")\"|" "$CLUSTER_DIR/cni/net.d/10-sandgate.conflist" \
		>"$dir/cni/net.d/10-sandgate.conflist"
	sed -e "s|$CLUSTER_DIR/containerd|$dir/containerd|g" -e "s|$CLUSTER_DIR/cni|$dir/cni|g" \
		-e "s|$CLUSTER_DIR/runc|$dir/runc|g" "$CLUSTER_DIR/containerd/config.toml" >"$dir/containerd/config.toml"
	cp -r "$CLUSTER_DIR/containerd/certs.d" "$dir/containerd/" # the same registries (write_registry_hosts)
	sed -e "s|^address: .*|address: $ip|" -e "s|$CLUSTER_DIR/containerd|$dir/containerd|" \
		-e "s|^cgroupRoot: .*|cgroupRoot: /$CGROUP/node-$n|" -e "s|^podLogsDir: .*|podLogsDir: $dir/pod-logs|" \
		"$CLUSTER_DIR/kubelet/config.yaml" >"$dir/kubelet/config.yaml"
	local node_ctr=("$BIN/ctr" --address "$dir/containerd/containerd.sock" --namespace k8s.io)
	START_NETNS=$netns start "containerd-$n" "$BIN/containerd" --config "$dir/containerd/config.toml"
	wait_for "containerd of node $n" 60 "${node_ctr[@]}" version
	local image
	for image in pause busybox; do
		"${node_ctr[@]}" images import "$CLUSTER_DIR/images/$image.tar" >>"$CLUSTER_DIR/logs/ctr.log" 2>&1
	done
	START_NETNS=$netns start "kubelet-$n" "$BIN/kubelet" --config "$dir/kubelet/config.yaml" \
		--kubeconfig "$CLUSTER_DIR/kubelet-$n.kubeconfig" --root-dir "$dir/kubelet" \
		--cert-dir "$dir/kubelet/pki" --hostname-override "$name" --node-ip "$ip"
	wait_for "node $name" 180 kubectl wait --for=condition=Ready "node/$name" --timeout=5s
}

save_sysctls
make_network
make_cgroups
make_pki
write_configs
write_registry_hosts
make_images
start_daemons
for ((node = 2; node <= NODE_COUNT; node++)); do add_node "$node"; done
echo "$KUBECONFIG_PATH"
