#!/usr/bin/env bash
# Installs the Debian packages corral needs, only those that are missing.
# Sourced by scripts/test.sh and scripts/demo.sh; safe to run on its own.
# `corral_install_deps PKG...` installs these packages as well (test.sh adds the test ones).
set -euo pipefail

CORRAL_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libboost-dev libssl-dev libyaml-cpp-dev libsqlite3-dev sqlite3
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libspdlog-dev libcli11-dev
  iproute2 procps systemd
)

# Only the tests need these: the end-to-end DDP test runs PyTorch (CPU build, gloo) with
# Debian's /usr/bin/python3. Large (~830 MB), so the demo does not install them.
CORRAL_TEST_PACKAGES=(
  python3-torch
  gdb          # corral stack's native stacks, run for real by its tests
  slurmctld slurmd slurm-client munge  # corral export --slurm, run by a private Slurm in the tests
  prometheus   # promtool check metrics, on the coordinator's /metrics
  chromium chromium-driver python3-selenium  # the status page, driven in a real browser
)
# scripts/fuzz.sh installs clang-16 and libclang-rt-16-dev for the fuzz targets.

corral_install_deps() {
  local missing=()
  local pkg
  for pkg in "${CORRAL_PACKAGES[@]}" "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  echo "corral: installing missing packages: ${missing[*]}"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    sudo=(sudo)
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  corral_install_deps
fi
