#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (ctest). Extra arguments go to
# ctest, e.g. `scripts/test.sh -L unit` or `scripts/test.sh -R Placement`.
set -euo pipefail

CORRAL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$CORRAL_ROOT/scripts/deps.sh"
source "$CORRAL_ROOT/scripts/build.sh"

corral_install_deps "${CORRAL_TEST_PACKAGES[@]}"
corral_build
cd "$CORRAL_BUILD"
ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@"
