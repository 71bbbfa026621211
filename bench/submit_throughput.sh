#!/usr/bin/env bash
# Submission throughput: a fresh coordinator (no agents: jobs stay pending), 8 clients
# on keep-alive TLS connections submitting 10,000 jobs, then `corral submit` run serially
# 200 times. Prints a table. Usage: bench/submit_throughput.sh [build dir]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
WORK=$(mktemp -d)
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT
TOKEN=$("$BUILD/coordinator/corral-coordinator" init --state-dir "$WORK/state" --admin bench 2>/dev/null)
cat > "$WORK/coordinator.yaml" <<YAML
listen: 127.0.0.1:0
state_dir: $WORK/state
YAML
"$BUILD/coordinator/corral-coordinator" --config "$WORK/coordinator.yaml" --port-file "$WORK/port" 2>"$WORK/log" &
PID=$!
for _ in $(seq 100); do [[ -s "$WORK/port" ]] && break; sleep 0.1; done
PORT=$(cat "$WORK/port")
printf 'name: cli\ncommand: ["true"]\nresources:\n  gpus_per_node: 1\n' > "$WORK/job.yaml"
export CORRAL_URL=https://127.0.0.1:$PORT CORRAL_TOKEN=$TOKEN CORRAL_CA=$WORK/state/ca.pem
ARGS=(--url "$CORRAL_URL" --ca "$CORRAL_CA" --token "$TOKEN" --clients 8 --jobs 10000)
if [[ -x "$BUILD/cli/corral" ]]; then ARGS+=(--cli "$BUILD/cli/corral" --cli-runs 200 --spec "$WORK/job.yaml"); fi
"$BUILD/bench/submit_load" "${ARGS[@]}"
