#!/usr/bin/env bash
# train_gpt2 as MPI processes against thread ranks (ctest entry train_gpt2_processes; tests/comm_test.cmake):
#   1. the same plan and global batch on N processes and on N threads trains to the same bits (parameters written
#      as llm.c checkpoints, compared with cmp; the printed losses too), N = 2 and 4, plans that replicate, shard
#      gradients with offloaded states, shard everything streamed through a device cache, and hybrid<2> (sharded in
#      pairs, replicated across them), fp32 and bf16;
#   2. checkpoints move between process and thread ranks and between rank counts: a checkpoint written by 2
#      processes and one written by 2 threads resume on 1 rank to the same bits; one written by 2 threads resumes on
#      4 processes as on 4 threads;
#   3. a process killed in the middle of step 3 ends the job (mpirun names the rank) within the timeout, the step-2
#      checkpoint is committed and intact, and resuming it with the survivor's count (1 process) trains to the bits
#      of a resume from the checkpoint of a run that was not interrupted;
#   4. a process that stops (SIGSTOP: hung, not dead, so mpirun sees nothing wrong) ends the job after
#      --comm-timeout, its peer naming it as stopped.
# Usage: train_gpt2_processes.sh TRAIN_GPT2 MPIEXEC WORK_DIR
set -euo pipefail
trainer=$1 mpiexec=$2 work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# A tiny model, the loops' products (bit-identical for any thread count), a constant rate, one measured profile.
common=(--layers 2 --channels 64 --global-batch 4 --matmul loops --measure-cache "$work/measure-cache")

fail() { echo "FAIL: $*" >&2; exit 1; }
# The lines that must agree between two runs: each step's loss and the validation loss.
losses() { grep -E '^step|^ +validation loss' "$1" | sed -E 's/  +[0-9]+ ms .*//'; }
same_run() {  # NAME_A NAME_B: the parameters and the losses of two runs are the same
  cmp "$1.bin" "$2.bin" || fail "$1 and $2 trained to different parameters"
  diff <(losses "$1.log") <(losses "$2.log") || fail "$1 and $2 printed different losses"
  echo "ok: $1 = $2"
}
threads() {  # NAME RANKS ARGS...: a run on thread ranks
  local name=$1 ranks=$2; shift 2
  "$trainer" "${common[@]}" --ranks "$ranks" "$@" --save-llmc "$name.bin" > "$name.log" 2>&1 ||
    { cat "$name.log"; fail "$name (threads) exited with $?"; }
}
processes() {  # NAME PROCESSES ARGS...: a run on MPI processes
  local name=$1 count=$2; shift 2
  timeout 300 "$mpiexec" -n "$count" "$trainer" "${common[@]}" --comm mpi "$@" --save-llmc "$name.bin" > "$name.log" 2>&1 ||
    { cat "$name.log"; fail "$name (mpi) exited with $?"; }
}

# 1. Processes train as threads do.
cached_sharded='min_waste/cached<pinned_host>/sharded/follows_home'
offloaded='min_waste/resident/shard_grads/offload<pinned_host>'
threads t2 2 --steps 3 --plan 'min_waste/resident/replicated/follows_home'
processes p2 2 --steps 3 --plan 'min_waste/resident/replicated/follows_home'
same_run t2 p2
threads t4_cached 4 --steps 3 --plan "$cached_sharded" --device-budget 2000KiB
processes p4_cached 4 --steps 3 --plan "$cached_sharded" --device-budget 2000KiB
grep -q 'streamed' p4_cached.log || fail "p4_cached streamed nothing: the budget no longer forces the cache"
same_run t4_cached p4_cached
threads t4_bf16 4 --steps 3 --plan "$offloaded" --dtype bf16
processes p4_bf16 4 --steps 3 --plan "$offloaded" --dtype bf16
same_run t4_bf16 p4_bf16
threads t4_hybrid 4 --steps 3 --plan 'min_waste/resident/hybrid<2>/follows_home'
processes p4_hybrid 4 --steps 3 --plan 'min_waste/resident/hybrid<2>/follows_home'
same_run t4_hybrid p4_hybrid

# 2. Checkpoints across process and thread ranks and rank counts (each resume works on a copy: it saves again).
threads t2_ckpt 2 --steps 2 --plan "$cached_sharded" --checkpoint ckpt_threads
processes p2_ckpt 2 --steps 2 --plan "$cached_sharded" --checkpoint ckpt_processes
cmp ckpt_threads/LATEST ckpt_processes/LATEST || fail "the two checkpoints name different steps"
resume() {  # CHECKPOINT COPY: a copy of a checkpoint directory to resume from
  rm -rf "$2" && cp -r "$1" "$2"
}
resume ckpt_threads r1; threads from_threads_1 1 --steps 4 --plan "$cached_sharded" --checkpoint r1 --resume
resume ckpt_processes r2; threads from_processes_1 1 --steps 4 --plan "$cached_sharded" --checkpoint r2 --resume
grep -q 'resumed from r2 after step 2' from_processes_1.log || fail "no resume after step 2"
same_run from_threads_1 from_processes_1
resume ckpt_threads r3; threads from_threads_4 4 --steps 4 --plan "$cached_sharded" --checkpoint r3 --resume
resume ckpt_threads r4; processes from_threads_p4 4 --steps 4 --plan "$cached_sharded" --checkpoint r4 --resume
same_run from_threads_4 from_threads_p4

# 3. A process killed mid-step: the job ends, naming it; the last checkpoint resumes on the survivor.
start=$(date +%s)
set +e
CHUNKWISE_GPT2_KILL_AT=1:3 timeout 120 "$mpiexec" -n 2 "$trainer" "${common[@]}" --comm mpi --steps 4 \
  --eval-every 2 --plan "$cached_sharded" --checkpoint ckpt_killed > killed.log 2>&1
status=$?
set -e
elapsed=$(( $(date +%s) - start ))
[ "$status" -ne 0 ] || fail "the job with a killed process exited 0"
[ "$status" -ne 124 ] || { cat killed.log; fail "the job with a killed process hung (killed by timeout after 120 s)"; }
grep -Eq 'process rank 1 .*(signal 9|Killed)' killed.log || { cat killed.log; fail "the killed rank is not named"; }
grep -q 'step    3/4' killed.log && fail "step 3 completed although rank 1 died in it"
[ "$(cat ckpt_killed/LATEST)" = "$(cat ckpt_processes/LATEST)" ] || fail "the committed step is not step 2"
echo "ok: killed at step 3, the job ended in ${elapsed} s with status $status, naming rank 1"
processes survivor 1 --steps 4 --plan "$cached_sharded" --checkpoint ckpt_killed --resume
grep -q 'resumed from ckpt_killed after step 2' survivor.log || fail "the survivor did not resume after step 2"
cmp survivor.bin from_processes_1.bin || fail "the survivor's resume trained to other parameters than a clean resume"
echo "ok: the survivor resumed from step 2 to the bits of a resume from the clean step-2 checkpoint"

# 4. A process that hangs: its peer's wait ends after --comm-timeout, naming it, and the job ends.
start=$(date +%s)
set +e
CHUNKWISE_GPT2_STOP_AT=1:3 timeout 120 "$mpiexec" -n 2 "$trainer" "${common[@]}" --comm mpi --steps 4 \
  --comm-timeout 3 > stopped.log 2>&1
status=$?
set -e
elapsed=$(( $(date +%s) - start ))
[ "$status" -ne 0 ] || fail "the job with a stopped process exited 0"
[ "$status" -ne 124 ] || { cat stopped.log; fail "the job with a stopped process hung (killed by timeout after 120 s)"; }
grep -Eq 'rank 0 waited 3000 ms for [a-z_]+ of [0-9]+ bytes.* to complete; rank 1 \(pid [0-9]+\) is stopped' stopped.log ||
  { cat stopped.log; fail "the stopped rank is not named"; }
echo "ok: rank 1 stopped in step 3; rank 0 named it after 3 s and the job ended in ${elapsed} s with status $status"
