#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang 16 into build-fuzz/ and runs each for
# SECONDS (default 30) from its seed corpus, then once over its saved regressions.
# `scripts/fuzz.sh [SECONDS]`. Where clang 16 cannot be installed it says so and skips.
set -euo pipefail

CORRAL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$CORRAL_ROOT/scripts/deps.sh"
seconds=${1:-30}

if ! corral_install_deps clang-16 libclang-rt-16-dev || ! command -v clang++-16 >/dev/null; then
  echo "corral: fuzz targets skipped: clang 16 (Debian's clang-16 and libclang-rt-16-dev) cannot be installed"
  exit 0
fi
build=${CORRAL_FUZZ_BUILD:-$CORRAL_ROOT/build-fuzz}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$CORRAL_ROOT} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
if [[ ! -f "$build/build.ninja" ]]; then
  CXX=clang++-16 cmake -S "$CORRAL_ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCORRAL_FUZZ=ON
fi
cmake -S "$CORRAL_ROOT" -B "$build" -DCORRAL_FUZZ_SECONDS="$seconds" >/dev/null
cmake --build "$build" -j "$(nproc)"
cd "$build"
# One at a time: each target uses a core, and the timings mean more alone.
ctest --output-on-failure -L fuzz
