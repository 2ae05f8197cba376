#!/usr/bin/env bash
# Two machines on one (ctest entry train_gpt2_two_machines): two network namespaces joined by a veth pair, Open MPI
# over TCP between them (mpirun in the first, its daemon started in the second by an rsh agent that enters the
# namespace instead of ssh), one train_gpt2 process in each. The trainer sees 2 machines and measures the link
# between them for the planner; three steps train to the bits of two thread ranks on one machine, and the bytes
# crossed the veth link. Exits 77 (ctest: skipped) where the kernel or the user may not make namespaces.
# Usage: two_machines.sh TRAIN_GPT2 MPIEXEC WORK_DIR
set -euo pipefail
trainer=$1 mpiexec=$2 work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
command -v ip > /dev/null || { echo "SKIP: no ip (iproute2)"; exit 77; }
tag=$$
a=cwa$tag b=cwb$tag subnet="10.$(( 100 + tag % 100 )).$(( tag / 100 % 250 ))"
cleanup() { ip netns del "$a" 2> /dev/null || true; ip netns del "$b" 2> /dev/null || true; }
trap cleanup EXIT
if ! ip netns add "$a" 2> netns.err || ! ip netns add "$b" 2>> netns.err; then
  echo "SKIP: this kernel or user may not create network namespaces: $(cat netns.err)"
  exit 77
fi
# Entering one remounts / (iproute2 makes it a slave mount), which fails where / is no mount point (a plain chroot).
if ! ip netns exec "$a" true 2> netns.err; then
  echo "SKIP: this system may not enter a network namespace: $(cat netns.err)"
  exit 77
fi
ip link add "v$a" type veth peer name "v$b"
ip link set "v$a" netns "$a"
ip link set "v$b" netns "$b"
ip -n "$a" addr add "$subnet.1/24" dev "v$a"
ip -n "$b" addr add "$subnet.2/24" dev "v$b"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "v$a" up
ip -n "$b" link set "v$b" up

# The agent Open MPI calls as it would call ssh: HOST COMMAND... runs COMMAND in that host's namespace.
cat > netns_rsh <<AGENT
#!/bin/sh
host=\$1; shift
case "\$host" in $subnet.1) ns=$a;; $subnet.2) ns=$b;; *) echo "netns_rsh: unknown host \$host" >&2; exit 1;; esac
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
chmod +x netns_rsh

export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
args=(--steps 3 --layers 2 --channels 64 --global-batch 4 --matmul loops --measure-cache "$work/measure-cache"
      --plan 'min_waste/cached<pinned_host>/sharded/follows_home')
"$trainer" "${args[@]}" --ranks 2 --save-llmc one_machine.bin > one_machine.log 2>&1 ||
  { cat one_machine.log; echo "FAIL: the thread-rank run exited with $?"; exit 1; }
received_before=$(ip netns exec "$b" cat "/sys/class/net/v$b/statistics/rx_bytes")
# TCP only (no shared memory between the "machines"), on the veth subnet only.
timeout 300 ip netns exec "$a" "$mpiexec" --host "$subnet.1:1,$subnet.2:1" -np 2 \
  --mca plm_rsh_agent "$work/netns_rsh" --mca btl self,tcp \
  --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
  -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
  "$trainer" "${args[@]}" --comm mpi --save-llmc two_machines.bin > two_machines.log 2>&1 ||
  { cat two_machines.log; echo "FAIL: the two-machine run exited with $?"; exit 1; }
received=$(( $(ip netns exec "$b" cat "/sys/class/net/v$b/statistics/rx_bytes") - received_before ))
grep -Eq '^machines: 2 of 1 process\(es\) each; between them an all-reduce reaches [0-9.]+ GB/s' two_machines.log ||
  { cat two_machines.log; echo "FAIL: the trainer did not see two machines and their link"; exit 1; }
cmp one_machine.bin two_machines.bin || { echo "FAIL: two machines trained to other parameters than one"; exit 1; }
diff <(grep -E '^step|^ +validation loss' one_machine.log | sed -E 's/  +[0-9]+ ms .*//') \
     <(grep -E '^step|^ +validation loss' two_machines.log | sed -E 's/  +[0-9]+ ms .*//') ||
  { echo "FAIL: the losses differ"; exit 1; }
# The second machine's rank gathers ZeRO-3 shards and reduces gradients: well over a MiB in 3 steps.
(( received > 1048576 )) || { echo "FAIL: only $received bytes crossed the veth link"; exit 1; }
echo "ok: 2 processes in 2 network namespaces over TCP train as 2 threads, bit for bit; $received bytes received over the link"
