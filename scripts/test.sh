#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (ctest), then each fuzz target for
# 30 s (scripts/fuzz.sh). Extra arguments go to ctest alone, e.g. `scripts/test.sh -L unit`
# or `scripts/test.sh -R Placement` (no fuzzing then).
#
# CORRAL_SANITIZE=address,undefined runs the whole suite built with those sanitizers in
# build-address-undefined/; CORRAL_SANITIZE=thread runs the threaded parts (BlockingWork,
# run_command beside a reaping thread, the server and clients on their loops) built with
# ThreadSanitizer in build-thread/.
set -euo pipefail

CORRAL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CORRAL_SANITIZE=${CORRAL_SANITIZE:-}
if [[ -n "$CORRAL_SANITIZE" ]]; then
  CORRAL_BUILD=${CORRAL_BUILD:-$CORRAL_ROOT/build-${CORRAL_SANITIZE//,/-}}
  CORRAL_CMAKE_ARGS=(-DCORRAL_SANITIZE="$CORRAL_SANITIZE")
  # A finding stops the program with a report on stderr, which the test shows.
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fi
source "$CORRAL_ROOT/scripts/deps.sh"
source "$CORRAL_ROOT/scripts/build.sh"

corral_install_deps "${CORRAL_TEST_PACKAGES[@]}"
if [[ "$CORRAL_SANITIZE" == thread ]]; then
  corral_build --target blocking_work_test agent_inventory_test net_test blocking_http_test keeper_relay_test
  cd "$CORRAL_BUILD"
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1} ctest --output-on-failure --timeout 600 \
    -R '^(BlockingWork|RunCommand|NetTest|NetLimitsTest|BlockingHttp|HttpClientResend|KeeperRelay)\.' "$@"
  exit 0
fi
corral_build
cd "$CORRAL_BUILD"
ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@"
if [[ $# -eq 0 && -z "$CORRAL_SANITIZE" ]]; then
  bash "$CORRAL_ROOT/scripts/fuzz.sh" 30
fi
