#!/usr/bin/env bash
# A local corral cluster on this machine: a coordinator and two agents (simulated
# 8-GPU inventories), plus an agent on the real GPUs when nvidia-smi finds any. Runs the
# example multi-node job and shows the queue, the nodes and a rank's log.
#
#   scripts/demo.sh          install what is missing, build, start, run the examples
#   scripts/demo.sh stop     stop every process the demo started
#
# State lives in $CORRAL_DEMO_DIR (default: /tmp/corral-demo).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEMO=$(realpath -m "${CORRAL_DEMO_DIR:-/tmp/corral-demo}")
BUILD=${CORRAL_BUILD:-$ROOT/build}

stop_demo() {
  [[ -d "$DEMO/pids" ]] || return 0
  local f pid
  for f in "$DEMO"/pids/*.pid; do
    [[ -e "$f" ]] || continue
    pid=$(cat "$f")
    # Only our own processes: the pid must still run a corral program.
    if kill -0 "$pid" 2>/dev/null && grep -q corral "/proc/$pid/cmdline" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
  done
  # The script's own connection keeper (docs/cli.md) ends once its socket is gone.
  rm -rf "$DEMO/run"
  for _ in $(seq 30); do pgrep -f "keep-connection --socket $DEMO/run/" >/dev/null || break; sleep 0.1; done
  echo "corral demo: stopped"
}

if [[ "${1:-}" == "stop" ]]; then
  stop_demo
  exit 0
fi

source "$ROOT/scripts/deps.sh"
source "$ROOT/scripts/build.sh"
corral_install_deps
corral_build --target corral-coordinator corral-agent corral corral-worker

stop_demo
rm -rf "$DEMO"
mkdir -p "$DEMO/pids" "$DEMO/logs" "$DEMO/agents"

COORD="$BUILD/coordinator/corral-coordinator"
AGENT="$BUILD/agent/corral-agent"
CLI="$BUILD/cli/corral"
export PATH="$BUILD/worker:$BUILD/cli:$PATH"   # ranks run corral-worker from here

ME=$(id -un)
TOKEN=$("$COORD" init --state-dir "$DEMO/state" --admin "$ME" --san 127.0.0.1 --san localhost 2>"$DEMO/logs/init.log")
cat > "$DEMO/coordinator.yaml" <<YAML
listen: 127.0.0.1:0
local_socket: $DEMO/coordinator.sock
state_dir: $DEMO/state
heartbeat_interval: 1s
node_timeout: 5s
reconnect_grace: 10s
kill_grace: 5s
YAML
"$COORD" --config "$DEMO/coordinator.yaml" --port-file "$DEMO/port" >"$DEMO/logs/coordinator.log" 2>&1 &
echo $! > "$DEMO/pids/coordinator.pid"
for _ in $(seq 100); do [[ -s "$DEMO/port" ]] && break; sleep 0.1; done
[[ -s "$DEMO/port" ]] || { echo "corral demo: the coordinator did not start; see $DEMO/logs/coordinator.log" >&2; exit 1; }
URL="https://127.0.0.1:$(cat "$DEMO/port")"

# Running as root, the agents run jobs as their submitter; the demo's submitter is root.
ROOT_JOBS=false
[[ $(id -u) -eq 0 ]] && ROOT_JOBS=true

start_agent() {  # name, simulate file or "" for nvidia-smi, first port
  local name=$1 sim=$2 port=$3
  "$COORD" issue-agent-cert --state-dir "$DEMO/state" --node "$name" --out "$DEMO/agents" 2>>"$DEMO/logs/init.log"
  {
    echo "node: $name"
    echo "coordinator: $URL"
    echo "ca: $DEMO/agents/ca.pem"
    echo "cert: $DEMO/agents/$name.pem"
    echo "key: $DEMO/agents/$name.key"
    echo "spool: $DEMO/spool/$name"
    echo "advertise: 127.0.0.1"
    echo "ports: $port-$((port + 99))"
    echo "allow_root_jobs: $ROOT_JOBS"
    echo "worker: $BUILD/worker/corral-worker"
    [[ -n "$sim" ]] && echo "simulate: $ROOT/configs/sim/$sim"
  } > "$DEMO/agents/$name.yaml"
  "$AGENT" --config "$DEMO/agents/$name.yaml" >"$DEMO/logs/agent-$name.log" 2>&1 &
  echo $! > "$DEMO/pids/agent-$name.pid"
}

# Two agents on one machine share its address and so its ports: corral never gives one
# port to two jobs of this host.
start_agent demo-a a100x8.yaml 29500
start_agent demo-b a100x8.yaml 29500
GPU_NODE=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  start_agent demo-gpu "" 29700
  GPU_NODE=demo-gpu
fi

export CORRAL_URL=$URL CORRAL_TOKEN=$TOKEN CORRAL_CA=$DEMO/state/ca.pem
# This script's commands leave their connection keeper (docs/cli.md) in the demo's folder,
# so that `scripts/demo.sh stop` ends it too.
mkdir -m 0700 -p "$DEMO/run"
export XDG_RUNTIME_DIR=$DEMO/run
want=2; [[ -n "$GPU_NODE" ]] && want=3
for _ in $(seq 100); do
  up=$("$CLI" nodes --json | grep -o '"state": *"up"' | wc -l || true)
  [[ "$up" -ge "$want" ]] && break
  sleep 0.1
done

echo
echo "== corral submit configs/examples/tcp-check-two-node.yaml"
JOB=$("$CLI" submit --json "$ROOT/configs/examples/tcp-check-two-node.yaml" | grep -o '[0-9]\+' | head -1)
echo "job $JOB"
"$CLI" wait "$JOB" --timeout 120 || true
if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
  echo
  echo "== corral submit configs/examples/ddp-gloo.yaml (PyTorch DDP over gloo, 2 nodes × 2 ranks)"
  { cat "$ROOT/configs/examples/ddp-gloo.yaml"; echo "workdir: $ROOT/configs/examples"; } > "$DEMO/ddp-gloo.yaml"
  DJOB=$("$CLI" submit --json "$DEMO/ddp-gloo.yaml" | grep -o '[0-9]\+' | head -1)
  "$CLI" wait "$DJOB" --timeout 300 || true
  "$CLI" logs "$DJOB" --rank 0 | tail -3
else
  echo
  echo "(PyTorch is not installed for /usr/bin/python3: apt-get install python3-torch to run configs/examples/ddp-gloo.yaml too)"
fi
if [[ -n "$GPU_NODE" ]]; then
  echo
  echo "== a one-GPU NCCL check on the real GPUs of $GPU_NODE"
  printf 'name: nccl-one-gpu\ncommand: [corral-worker, nccl-check]\nresources: {gpus_per_node: 1, gpu: {model: "%s"}}\nlaunch: {mode: nccl}\ntime_limit: 5m\n' \
    "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" > "$DEMO/nccl-one-gpu.yaml"
  GJOB=$("$CLI" submit --json "$DEMO/nccl-one-gpu.yaml" | grep -o '[0-9]\+' | head -1)
  "$CLI" wait "$GJOB" --timeout 300 || true
fi

echo
echo "== corral nodes (on this machine, through the coordinator's local socket: no TLS, no CA)"
CORRAL_URL=unix:$DEMO/coordinator.sock CORRAL_CA= "$CLI" nodes
echo
echo "== corral queue --all"
"$CLI" queue --all
echo
echo "== corral show $JOB"
"$CLI" show "$JOB"
echo
echo "== corral logs $JOB --rank 0"
"$CLI" logs "$JOB" --rank 0
echo
cat <<EOF2
The cluster keeps running. To use it from this shell:

  export CORRAL_URL=$URL
  export CORRAL_TOKEN=$TOKEN
  export CORRAL_CA=$DEMO/state/ca.pem
  export PATH=$BUILD/cli:\$PATH
  corral queue

After the first command over TLS, the next ones go through your connection keeper, a
background process that keeps the TLS connection (docs/cli.md; it ends after 10 idle
minutes, CORRAL_KEEP_CONNECTION=0 turns it off). On this machine
CORRAL_URL=unix:$DEMO/coordinator.sock (the coordinator's local socket) works too,
without CORRAL_CA.

Status page: $URL/ (the CA is $DEMO/state/ca.pem). Logs: $DEMO/logs/.
Stop it with: scripts/demo.sh stop
EOF2
