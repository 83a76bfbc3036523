#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian host (run as root), in two stages:
#   bootstrap.sh run    what `sandgate serve` needs at run time: nft, ip, bwrap, the CA bundle,
#                       a Python >= 3.12 and .venv with sandgate and its run-time dependencies.
#   bootstrap.sh test   (the default; also `make bench`, `make lint`, `make images`) run's part,
#                       then the test and benchmark tools and sandgate's dev extras.
#   bootstrap.sh cluster  run's part, then what `make cluster` needs besides what it builds
#                       (scripts/cluster/build.sh, docs/kubernetes.md); test installs it too.
# A second run does nothing unless a package is missing or pyproject.toml changed.
# Tools installed for tests never stay running: services they bring are neither started by the
# package scripts nor enabled (squid on :3128, nginx on :80, dockerd; tests start their own).
set -euo pipefail
cd "$(dirname "$0")/.."

stage=${1:-test}
case $stage in
  run | test | cluster) ;;
  *) echo "bootstrap: unknown stage '$stage' (use 'run', 'test' or 'cluster')" >&2; exit 2 ;;
esac

# Run time: nft + ip for sandbox networks, bwrap for the local runtime, CA bundle for upstream TLS,
# mkfs.ext4 for each sandbox's own filesystem (the disk cap), skopeo pulls images by reference
# for the local runtime (docs/images.md).
RUN_PACKAGES=(nftables iproute2 bubblewrap ca-certificates e2fsprogs skopeo)
# Tests and benchmarks: docker.io for the Docker runtime (the tests start a private dockerd),
# busybox for tiny test images (`make images`), chromium drives the console tests, the test
# internet's and the benchmarks' servers and load generators, dig for DNS answers seen from inside,
# docker-registry (distribution) and htpasswd (apache2-utils) for the test registry; certutil
# (libnss3-tools) and pip for python3 in the browser example's sandbox (examples/browser); git and
# pip (with setuptools and wheel) for the workload a sandbox runs in
# tests/conformance/test_policy_workload.py (pip builds the test index's wheel, too); a JDK for
# Java inside `sandgate/host` sandboxes (truststore with the proxy CA, Java code contexts);
# PostgreSQL for the state database's tests on it (tests/support/postgres.py starts its own).
TEST_PACKAGES=(iptables busybox-static docker.io curl chromium nginx-light wrk squid nghttp2-client
  bind9-dnsutils docker-registry apache2-utils libnss3-tools python3-pip git default-jdk-headless
  postgresql)
# gVisor's runsc for the `gvisor` isolation (tests; a server that offers gvisor needs it too).
# Bookworm's 0.0~20221219 fails statx(2) as Debian 12's coreutils call it (`ls /` inside says
# "Invalid argument"), so it comes from bookworm-backports (docs/runtime.md has the measurements).
RUNSC_MIN_VERSION=0.0~20240729
# The one-node cluster (`make cluster`): runc and the CNI plugins from Debian (new enough for
# containerd 2 and the CNI spec 1.0), busybox for its test image, openssl for its certificates.
CLUSTER_PACKAGES=(runc containernetworking-plugins busybox-static openssl curl util-linux)
# The services the test packages would start; disabled again when this run installed them.
TEST_SERVICES=(squid nginx docker.socket docker containerd docker-registry postgresql)

missing_packages() {
  local pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
  done
}

# Installs the missing ones among "$@" with every service start refused (policy-rc.d 101,
# honoured by invoke-rc.d and deb-systemd-invoke); prints what it installed.
apt_install() {
  local missing
  mapfile -t missing < <(missing_packages "$@")
  ((${#missing[@]})) || return 0
  if [[ $(id -u) -ne 0 ]]; then
    echo "bootstrap: missing Debian packages: ${missing[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "bootstrap: installing ${missing[*]}" >&2
  local own_policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# written by sandgate bootstrap while it installs packages\nexit 101\n' \
      >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  local status=0
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || status=$?
  [[ -n $own_policy ]] && rm -f /usr/sbin/policy-rc.d
  ((status == 0)) || exit "$status"
  printf '%s\n' "${missing[@]}"
}

# runsc >= RUNSC_MIN_VERSION from bookworm-backports, whose source is added (priority 100: nothing
# else is taken from it) on the mirror this host already uses for bookworm.
install_runsc() {
  local have mirror
  have=$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || true)
  [[ -n $have ]] && dpkg --compare-versions "$have" ge "$RUNSC_MIN_VERSION" && return 0
  if [[ $(id -u) -ne 0 ]]; then
    echo "bootstrap: runsc >= $RUNSC_MIN_VERSION is missing; run as root or install it" >&2
    exit 1
  fi
  if ! apt-get indextargets --format '$(RELEASE)' | grep -qx bookworm-backports; then
    mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' | awk '$2 == "bookworm" {print $1; exit}')
    if [[ -z $mirror ]]; then
      echo "bootstrap: no bookworm apt source to add bookworm-backports beside;" \
        "install runsc >= $RUNSC_MIN_VERSION yourself" >&2
      exit 1
    fi
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: %s\n' \
      "$mirror" /usr/share/keyrings/debian-archive-keyring.gpg >/etc/apt/sources.list.d/sandgate-backports.sources
  fi
  echo "bootstrap: installing runsc from bookworm-backports" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends -t bookworm-backports runsc >/dev/null
}

# On a systemd host, the test services are disabled (they would start at the next boot) and
# stopped (in case something started them anyway).
quiet_test_services() {
  [[ -d /run/systemd/system ]] || return 0
  local unit
  for unit in "${TEST_SERVICES[@]}"; do
    if systemctl list-unit-files "$unit.service" "$unit" >/dev/null 2>&1; then
      systemctl disable --now "$unit" >/dev/null 2>&1 || true
    fi
  done
}

# Nothing the test packages brought may listen (squid :3128, nginx :80).
check_no_test_listeners() {
  local found
  found=$(ss -Hltnp 'sport = :80 or sport = :3128' 2>/dev/null | grep -E 'squid|nginx' || true)
  if [[ -n $found ]]; then
    echo "bootstrap: a test service is listening; stop it (systemctl disable --now squid nginx):" >&2
    echo "$found" >&2
    exit 1
  fi
}

find_python() {
  local candidates=(python3.13 python3.12)
  local root="${PYENV_ROOT:-$HOME/.pyenv}"
  for v in "$root"/versions/3.13* "$root"/versions/3.12*; do candidates+=("$v/bin/python"); done
  for py in "${candidates[@]}"; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$py"; return 0
    fi
  done
  return 1
}

ensure_venv() {
  [[ -x .venv/bin/python ]] && return 0
  local py
  py=$(find_python) || {
    echo "bootstrap: no Python >= 3.12 found (tried python3.13, python3.12, pyenv versions);" \
      "install one (e.g. 'pyenv install 3.13') and re-run" >&2
    exit 1
  }
  echo "bootstrap: creating .venv with $py"
  "$py" -m venv .venv
}

# pip install -e "$1" once per pyproject.toml change; the dev stamp implies the run-time one.
pip_install() {
  local target=$1 stamp=$2
  [[ -f $stamp && $stamp -nt pyproject.toml ]] && return 0
  echo "bootstrap: installing $target into .venv"
  .venv/bin/pip install -q --disable-pip-version-check -e "$target"
  touch "$stamp"
}

run_stage() {
  apt_install "${RUN_PACKAGES[@]}" >/dev/null
  ensure_venv
  if [[ ! -f .venv/.sandgate-installed || pyproject.toml -nt .venv/.sandgate-installed ]]; then
    pip_install . .venv/.sandgate-run
  fi
}

test_stage() {
  run_stage
  local installed
  installed=$(apt_install "${TEST_PACKAGES[@]}" "${CLUSTER_PACKAGES[@]}")
  install_runsc
  [[ -n $installed ]] && quiet_test_services
  check_no_test_listeners
  pip_install '.[dev]' .venv/.sandgate-installed
  js_test_clients
  sdk_test_clients
  code_interpreter_wheels
  browser_wheels
  go_kernel
}

# GoNB (the Go code contexts' Jupyter kernel) with the goimports and gopls it runs, built from the
# Go module proxy with the host's Go once per version (in ~/.cache/sandgate/gonb/<versions>), then
# put next to .venv's Python with a link to that `go`, where execd finds them (execd/kernels.py) and
# sandbox-images/build.py copies them from. gonb is built inside a module that requires it (a
# plain `go install gonb@v` also asks the proxy for gonb's version list, which is refused).
GONB_VERSION=v0.11.1
GO_TOOLS_VERSION=v0.45.0  # golang.org/x/tools: goimports
GOPLS_VERSION=v0.23.0
go_kernel() {
  local go dir build
  go=$(command -v go || true)
  [[ -z $go && -x /usr/local/go/bin/go ]] && go=/usr/local/go/bin/go
  if [[ -z $go ]]; then
    echo "bootstrap: no Go toolchain: Go code contexts are not installed" >&2
    return 0
  fi
  dir=${SANDGATE_GO_KERNEL_CACHE:-$HOME/.cache/sandgate/gonb}/$GONB_VERSION-$GO_TOOLS_VERSION-$GOPLS_VERSION-$("$go" env GOVERSION)
  if [[ ! -f $dir/.complete ]]; then
    echo "bootstrap: building GoNB $GONB_VERSION, goimports and gopls into $dir"
    build=$(mktemp -d)
    (
      mkdir "$build/module" && cd "$build/module"
      export GOPATH=$build/gopath GOCACHE=$build/cache GOFLAGS=-modcacherw GOTOOLCHAIN=local GOTELEMETRY=off
      printf 'module example.test/gonb\n\ngo 1.24\n\nrequire github.com/janpfeifer/gonb %s\n\ntool github.com/janpfeifer/gonb\n' \
        "$GONB_VERSION" >go.mod
      nice -n 10 "$go" mod tidy 2>tidy.log || { cat tidy.log >&2; exit 1; }
      mkdir -p "$dir/bin"
      nice -n 10 "$go" build -o "$dir/bin/gonb" github.com/janpfeifer/gonb
      GOBIN=$dir/bin nice -n 10 "$go" install "golang.org/x/tools/cmd/goimports@$GO_TOOLS_VERSION"
      GOBIN=$dir/bin nice -n 10 "$go" install "golang.org/x/tools/gopls@$GOPLS_VERSION"
    ) || { rm -rf "$build"; return 1; }
    rm -rf "$build"
    touch "$dir/.complete"
  fi
  # copies, not links: a sandgate/host sandbox sees .venv (bound in), not the cache under ~
  for tool in gonb goimports gopls; do
    cmp -s "$dir/bin/$tool" ".venv/bin/$tool" || install -m 755 "$dir/bin/$tool" ".venv/bin/$tool"
  done
  ln -sfn "$(readlink -f "$go")" .venv/bin/go
}

cluster_stage() {
  run_stage
  apt_install "${CLUSTER_PACKAGES[@]}" >/dev/null
}

# Playwright (the version the console tests use) for the host's python3, which the browser
# example installs inside a sandbox from the test internet's package index (tests/conformance).
browser_wheels() {
  local wheels=${SANDGATE_BROWSER_WHEELS:-$HOME/.cache/sandgate/browser-wheels} version
  version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("playwright"))')
  compgen -G "$wheels/playwright-$version-*.whl" >/dev/null && return 0
  rm -f "$wheels"/*.whl  # an older version's
  /usr/bin/python3 -m pip download --quiet --disable-pip-version-check --only-binary :all: \
    -d "$wheels" "playwright==$version" >/dev/null
}

# The opensandbox/code-interpreter image's packages (sandbox-images/code-interpreter), downloaded
# now: the tests build the image inside network namespaces that reach no package index.
code_interpreter_wheels() {
  .venv/bin/python sandbox-images/build.py --wheels-only >/dev/null
}

# OpenSandbox's Go SDK and Java/Kotlin SDK the conformance tests build (tests/go, tests/java),
# fetched now: the tests build offline, inside network namespaces that reach no registry. Go keeps
# modules and builds in its own caches; Maven's repository is SANDGATE_MAVEN_REPO
# (~/.cache/sandgate/m2). Each is fetched again only when go.sum or pom.xml changed. Debian's
# golang-go 1.19 is older than the SDK needs: a host without Go gets bookworm-backports' (1.23).
sdk_test_clients() {
  if ! command -v go >/dev/null; then
    echo "bootstrap: installing golang-go from bookworm-backports" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends -t bookworm-backports golang-go >/dev/null
  fi
  command -v mvn >/dev/null || apt_install maven >/dev/null
  local m2=${SANDGATE_MAVEN_REPO:-$HOME/.cache/sandgate/m2} digest build
  digest=$(cat tests/go/go.sum tests/java/pom.xml | sha256sum | cut -c1-16)
  [[ -f $m2/.sandgate-sdk-$digest ]] && return 0
  echo "bootstrap: fetching the test-only Go and Java/Kotlin SDKs"
  (cd tests/go && GOFLAGS=-mod=readonly GOTOOLCHAIN=local go mod download)
  # a whole build, so that Maven also fetches its plugins and the Kotlin compiler
  build=$(mktemp -d)
  (cd tests/java && mvn -B -q -Dstyle.color=never -Dmaven.repo.local="$m2" -Dtour.build="$build" compile >/dev/null)
  rm -rf "$build"
  touch "$m2/.sandgate-sdk-$digest"
}

# The OpenSandbox JS SDK the conformance tests drive (tests/js: its package.json and lockfile),
# into tests/js/node_modules only; again when the lockfile changed.
js_test_clients() {
  command -v node >/dev/null || apt_install nodejs >/dev/null
  command -v npm >/dev/null || apt_install npm >/dev/null
  local stamp=tests/js/node_modules/.sandgate-installed
  [[ -f $stamp && $stamp -nt tests/js/package-lock.json ]] && return 0
  echo "bootstrap: installing the test-only JS SDK into tests/js/node_modules"
  (cd tests/js && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  touch "$stamp"
}

"${stage}_stage"
