#!/usr/bin/env bash
# Side by side: the reference stack (Linux's vmw_pvrdma + rdma-core, perftest)
# and vfrdma (pvctl) on the same bench, the same emulated device, RC SEND
# between two guests, 64 B and 4 KiB, the same message counts; the doorbells
# each device received, counted on the device side (QEMU's trace).
# Usage: scripts/sidebyside.sh [MESSAGES] [ITERS]
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
MSGS=${1:-5000}
ITERS=${2:-1000}
PVVM=($GO run ./cmd/pvvm -vms 2 -doorbells)

# run LABEL ARGS...: one pvvm run; its output in $out (and on failure, stderr).
run() {
  local label=$1; shift
  if ! out=$("${PVVM[@]}" "$@" 2>&1); then
    echo "sidebyside: the $label run failed:" >&2
    echo "$out" | tail -30 >&2
    exit 1
  fi
}
# doorbells VM: the device-side doorbell counts of one VM, as "QP SEND=n ...".
doorbells() { echo "$out" | sed -n "s/^vm$1: device-side doorbells (QEMU's pvrdma_uar_write)://p"; }
# dbsum VM KIND...: the sum of those kinds' counts.
dbsum() {
  local vm=$1; shift
  doorbells "$vm" | tr ' ' '\n' | awk -F= -v kinds="$*" '
    BEGIN { n = split(kinds, k, ","); for (i = 1; i <= n; i++) want[k[i]] = 1 }
    want[$1] { s += $2 } END { print s + 0 }'
}

declare -A rate lat db_snd db_all
for size in 64 4096; do
  # Reference: ib_send_bw (CQ moderation 1: QEMU 7.2 completes every send
  # WQE, signaled or not, so perftest's default moderation overflows its CQ)
  # and ib_send_lat, VM 0 the server.
  run "reference ib_send_bw $size B" -ref 2 -- \
    @0 ib_send_bw -x 1 -Q 1 -n "$MSGS" -s "$size" + @1 retry ib_send_bw -x 1 -Q 1 -n "$MSGS" -s "$size" 192.168.100.1
  rate[ref,$size]=$(echo "$out" | awk -v s="$size" '$1 == "vm1:" && $2 == s && NF == 6 { printf "%.0f", $6 * 1e6 }')
  db_snd[ref,$size]=$(dbsum 1 QP_SEND)
  db_all[ref,$size]=$(( $(dbsum 1 QP_SEND,QP_RECV,CQ_POLL,CQ_ARM) + $(dbsum 0 QP_SEND,QP_RECV,CQ_POLL,CQ_ARM) ))
  run "reference ib_send_lat $size B" -ref 2 -- \
    @0 ib_send_lat -x 1 -n "$ITERS" -s "$size" + @1 retry ib_send_lat -x 1 -n "$ITERS" -s "$size" 192.168.100.1
  lat[ref,$size]=$(echo "$out" | awk -v s="$size" '$1 == "vm1:" && $2 == s && NF >= 10 { print $6 }')  # t_typical

  # vfrdma: pvctl bench (the sender's rate at one doorbell per message and
  # at 32 per doorbell) and pvctl pingpong (half its round trip is what
  # ib_send_lat reports).
  run "vfrdma bench $size B" -- bench --vm --rc --size "$size" --messages "$MSGS" --batches 1,32
  # VM 1 sends (VM 0 is the bench's server, the receiver).
  rate[vf1,$size]=$(echo "$out" | awk '$1 == "vm1:" && $2 == "1" && NF == 7 { print $4 }')
  rate[vf32,$size]=$(echo "$out" | awk '$1 == "vm1:" && $2 == "32" && NF == 7 { print $4 }')
  db_snd[vf,$size]=$(dbsum 1 QP_SEND)
  db_all[vf,$size]=$(( $(dbsum 0 QP_SEND,QP_RECV,CQ_POLL,CQ_ARM) + $(dbsum 1 QP_SEND,QP_RECV,CQ_POLL,CQ_ARM) ))
  run "vfrdma pingpong $size B" -- pingpong --vm --rc --size "$size" --iters "$ITERS"
  lat[vf,$size]=$(echo "$out" | awk '$1 == "vm0:" && /per round trip/ { for (i = 1; i <= NF; i++) if ($i == "µs") { printf "%.2f", $(i-1) / 2; exit } }')
  # The same with the POLL doorbell on every empty poll and spinning, as
  # rdma-core's provider and programs do (on QEMU the doorbell harvests the
  # backend's completions at once).
  run "vfrdma pingpong --poll-doorbell --spin $size B" -- pingpong --vm --rc --size "$size" --iters "$ITERS" --poll-doorbell --spin
  lat[vfpd,$size]=$(echo "$out" | awk '$1 == "vm0:" && /per round trip/ { for (i = 1; i <= NF; i++) if ($i == "µs") { printf "%.2f", $(i-1) / 2; exit } }')
  run "vfrdma bench --poll-doorbell $size B" -- bench --vm --rc --size "$size" --messages "$MSGS" --batches 1,32 --poll-doorbell
  rate[vfpd1,$size]=$(echo "$out" | awk '$1 == "vm1:" && $2 == "1" && NF == 7 { print $4 }')
  rate[vfpd32,$size]=$(echo "$out" | awk '$1 == "vm1:" && $2 == "32" && NF == 7 { print $4 }')
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
echo
echo "RC SEND between two guests on the same bench (QEMU 7.2 pvrdma under TCG, the softverbs backend)"
echo "$MSGS messages per rate run, $ITERS iterations per latency run; doorbells counted by QEMU (pvrdma_uar_write)"
echo
printf "| %-6s | %-40s | %12s | %14s | %22s | %-24s |\n" size stack "msg/s" "latency µs" "doorbells (both VMs)" "vfrdma/reference (rate)"
printf "|%s|%s|%s|%s|%s|%s|\n" -------- ------------------------------------------ -------------- ---------------- ------------------------ --------------------------
for size in 64 4096; do
  printf "| %-6s | %-40s | %12s | %14s | %22s | %-24s |\n" "$size" "reference: ib_send_bw / ib_send_lat" "${rate[ref,$size]}" "${lat[ref,$size]}" "${db_all[ref,$size]}" ""
  printf "| %-6s | %-40s | %12s | %14s | %22s | %-24s |\n" "$size" "vfrdma: bench batch 1 / pingpong" "${rate[vf1,$size]}" "${lat[vf,$size]}" "${db_all[vf,$size]}" "$(ratio "${rate[vf1,$size]}" "${rate[ref,$size]}")"
  printf "| %-6s | %-40s | %12s | %14s | %22s | %-24s |\n" "$size" "vfrdma: bench batch 32" "${rate[vf32,$size]}" "" "" "$(ratio "${rate[vf32,$size]}" "${rate[ref,$size]}")"
  printf "| %-6s | %-40s | %12s | %14s | %22s | %-24s |\n" "$size" "vfrdma --poll-doorbell: batch 1 / --spin" "${rate[vfpd1,$size]}" "${lat[vfpd,$size]}" "" "$(ratio "${rate[vfpd1,$size]}" "${rate[ref,$size]}")"
  printf "| %-6s | %-40s | %12s | %14s | %22s | %-24s |\n" "$size" "vfrdma --poll-doorbell: batch 32" "${rate[vfpd32,$size]}" "" "" "$(ratio "${rate[vfpd32,$size]}" "${rate[ref,$size]}")"
done
echo
echo "Doorbells: the reference run's (ib_send_bw) and vfrdma's bench run (batches 1 and 32), both VMs, every kind"
echo "(QP SEND, QP RECV, CQ POLL, CQ ARM). Per kind:"
for size in 64 4096; do
  echo "  $size B: reference sender QP SEND=${db_snd[ref,$size]} for $MSGS messages; vfrdma sender QP SEND=${db_snd[vf,$size]} for $((2 * MSGS)) messages"
done
