#!/usr/bin/env bash
# Configures and builds corral into build/ (one tree, ccache). Sourced or run.
set -euo pipefail

CORRAL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CORRAL_BUILD=${CORRAL_BUILD:-$CORRAL_ROOT/build}

# CORRAL_CMAKE_ARGS (an array) adds configure options, e.g. (-DCORRAL_SANITIZE=thread).
if ! declare -p CORRAL_CMAKE_ARGS >/dev/null 2>&1; then
  CORRAL_CMAKE_ARGS=()
fi
corral_build() {
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
  # Paths under the checkout hashed as relative ones: another clone of the same commit
  # (CI's) finds what this one compiled.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$CORRAL_ROOT} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
  if [[ ! -f "$CORRAL_BUILD/build.ninja" ]]; then
    cmake -S "$CORRAL_ROOT" -B "$CORRAL_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      "${CORRAL_CMAKE_ARGS[@]}"
  fi
  cmake --build "$CORRAL_BUILD" -j "$(nproc)" "$@"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  source "$CORRAL_ROOT/scripts/deps.sh"
  corral_install_deps
  corral_build "$@"
fi
