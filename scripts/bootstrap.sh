#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian host (run as root): the Debian packages sandgate needs,
# a Python >= 3.12, and .venv with sandgate installed editable with its dev extras.
# A second run does nothing unless a package is missing or pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: nft + ip for sandbox networks, bwrap for the local runtime, docker.io for the
# Docker runtime (its dockerd is started by the tests, never here), busybox for tiny test images.
APT_PACKAGES=(nftables iproute2 iptables bubblewrap busybox-static docker.io ca-certificates curl chromium nginx-light wrk squid nghttp2-client)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "bootstrap: missing Debian packages: ${missing[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "bootstrap: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

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

if [[ ! -x .venv/bin/python ]]; then
  py=$(find_python) || {
    echo "bootstrap: no Python >= 3.12 found (tried python3.13, python3.12, pyenv versions);" \
      "install one (e.g. 'pyenv install 3.13') and re-run" >&2
    exit 1
  }
  echo "bootstrap: creating .venv with $py"
  "$py" -m venv .venv
fi

stamp=.venv/.sandgate-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  echo "bootstrap: installing sandgate[dev] into .venv"
  .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
  touch "$stamp"
fi
