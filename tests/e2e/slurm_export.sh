#!/usr/bin/env bash
# `corral export --slurm` against a real Slurm: Debian's slurmctld and two slurmd on this
# host (NodeName n1, n2; each its own port and spool; NodeAddr 127.0.0.1; 4 gres GPUs
# each, files that are links to /dev/null), one private munged. Two exported 2-node jobs
# run through sbatch: one writes every rank's environment, which is checked against
# corral's rank contract; one is corral's own tcp-check, which completes only if every
# rank reaches rank 0 at MASTER_ADDR:MASTER_PORT. Exit 77 (skipped) with the reason where
# Slurm is not installed or cannot start here.
#   tests/e2e/slurm_export.sh CORRAL_BIN WORKER_BIN
set -uo pipefail
corral=$1
worker=$2
skip() { echo "SKIPPED: $*"; exit 77; }
for b in slurmctld slurmd munged sbatch sinfo scontrol; do
  command -v "$b" >/dev/null || skip "$b is not installed (Debian: slurmctld slurmd slurm-client munge)"
done
[[ $(id -u) == 0 ]] || skip "slurmd must run as root"

dir=$(mktemp -d /tmp/corral-slurm.XXXXXX)
chmod 700 "$dir"
cleanup() {
  for f in "$dir"/slurmd-n1.pid "$dir"/slurmd-n2.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null
  done
  sleep 0.5
  for f in "$dir"/*.pid; do [[ -f $f ]] && kill -9 "$(cat "$f")" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  for log in "$dir"/*.log "$dir"/out/*.out; do [[ -f $log ]] && { echo "== $log"; tail -20 "$log"; }; done
  exit 1
}

# Ports from this process's id, so parallel runs do not meet.
base=$((30000 + ($$ % 500) * 8))
mkdir -p "$dir/ctld" "$dir/gpu" "$dir/out"
for i in 0 1 2 3; do ln -s /dev/null "$dir/gpu/nvidia$i"; done
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$dir/munge.key"
munged -f --key-file="$dir/munge.key" --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" || skip "munged does not start here"
cpus=$(nproc)
cat > "$dir/slurm.conf" <<CONF
ClusterName=corraltest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$base
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=n1 NodeAddr=127.0.0.1 NodeHostname=localhost Port=$((base + 1)) CPUs=$cpus RealMemory=500 Gres=gpu:4 State=UNKNOWN
NodeName=n2 NodeAddr=127.0.0.1 NodeHostname=localhost Port=$((base + 2)) CPUs=$cpus RealMemory=500 Gres=gpu:4 State=UNKNOWN
PartitionName=p Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
CONF
echo "NodeName=n1,n2 Name=gpu File=$dir/gpu/nvidia[0-3]" > "$dir/gres.conf"
export SLURM_CONF=$dir/slurm.conf
mkdir -p "$dir/spool-n1" "$dir/spool-n2"
slurmctld -c -f "$SLURM_CONF" || skip "slurmctld does not start here"
slurmd -f "$SLURM_CONF" -N n1 || skip "slurmd does not start here"
slurmd -f "$SLURM_CONF" -N n2 || skip "slurmd does not start here"
for _ in $(seq 100); do
  [[ $(sinfo -h -o %t 2>/dev/null | sort -u) == idle ]] && break
  sleep 0.2
done
[[ $(sinfo -h -o %t 2>/dev/null | sort -u) == idle ]] || skip "the private Slurm cluster did not come up: $(sinfo 2>&1 | tail -1)"

cd "$dir/out"
# 1. Every rank's environment.
"$corral" export --slurm -N 2 --gpus-per-node 2 --time 5m -J envcheck -- \
  sh -c 'env | grep -E "^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|NODE_RANK|GROUP_RANK|MASTER_ADDR|MASTER_PORT|CUDA_VISIBLE_DEVICES|CORRAL_JOB_ID|CORRAL_NNODES)=" | sort > "rank-$RANK.env"' \
  > env.sbatch || fail "export"
grep -q '^#SBATCH --nodes=2$' env.sbatch || fail "no --nodes=2 in the script"
timeout 120 sbatch --wait -o env-%j.out env.sbatch > submitted || fail "the exported job failed"
job=$(awk '{print $NF}' submitted)
port=$((20000 + job % 10000))
for r in 0 1 2 3; do
  [[ -f rank-$r.env ]] || fail "rank $r wrote no environment"
  want="CORRAL_JOB_ID=$job
CORRAL_NNODES=2
CUDA_VISIBLE_DEVICES=0,1
GROUP_RANK=$((r / 2))
LOCAL_RANK=$((r % 2))
LOCAL_WORLD_SIZE=2
MASTER_ADDR=127.0.0.1
MASTER_PORT=$port
NODE_RANK=$((r / 2))
RANK=$r
WORLD_SIZE=4"
  [[ $(cat "rank-$r.env") == "$want" ]] || fail "rank $r: got
$(cat "rank-$r.env")
want
$want"
done
echo "ok: 4 ranks on 2 Slurm nodes saw corral's rank environment (job $job)"

# 2. corral's own tcp-check: every rank connects to rank 0 and the sums agree.
"$corral" export --slurm -N 2 --gpus-per-node 2 --time 5m -J tcp -- "$worker" tcp-check > tcp.sbatch || fail "export"
timeout 120 sbatch --wait -o tcp.out tcp.sbatch > /dev/null || fail "tcp-check under Slurm failed"
[[ $(grep -c '"ok":true' tcp.out) == 4 ]] || fail "tcp-check: not every rank says ok"
echo "ok: corral-worker tcp-check completed on 4 ranks under Slurm"
