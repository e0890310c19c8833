#!/usr/bin/env bash
# Side by side: the reference stack (Linux's vmw_pvrdma + rdma-core, perftest)
# and vfrdma (pvctl) on the same bench, the same emulated device, RC SEND
# between two guests, 64 B and 4 KiB, the same message counts and the same
# messages in flight; the doorbells each device received, counted on the
# device side (QEMU's trace). Every figure is the median of REPS runs.
# Usage: scripts/sidebyside.sh [MESSAGES] [ITERS] [REPS]
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
MSGS=${1:-20000}
ITERS=${2:-1000}
REPS=${3:-3}
# Messages in flight: ib_send_bw keeps its tx depth (-t, 128 by default) in
# flight whatever it posts per doorbell; pvctl bench keeps the same.
WINDOW=128
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
# reps CMD...: CMD REPS times, as pvvm commands ("+" between them); %R in
# an argument becomes the run's number (pvctl's --vm exchange needs a tag
# per run in one boot).
reps() {
  local i a
  for ((i = 0; i < REPS; i++)); do
    [ $i = 0 ] || printf '%s\n' +
    for a in "$@"; do printf '%s\n' "${a//%R/$i}"; done
  done
}
# median: the median of the numbers on stdin, one per line ("-" if none).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# dbpm MESSAGES: doorbells of every kind both devices received in the run,
# per message.
dbpm() {
  echo "$out" | sed -n "s/^vm[01]: device-side doorbells (QEMU's pvrdma_uar_write)://p" | tr ' ' '\n' |
    awk -F= -v m="$1" '$2 != "" { s += $2 } END { printf "%.2f", s / m }'
}
# kinds: the doorbell counts per kind of both VMs, for the notes.
kinds() { echo "$out" | sed -n "s/^\(vm[01]\): device-side doorbells (QEMU's pvrdma_uar_write):/\1/p" | tr '\n' ';'; }
# benchrate BATCH: median of the sender's (VM 1) msg/s rows of that batch.
benchrate() { echo "$out" | awk -v b="$1" '$1 == "vm1:" && $2 == b && NF == 10 { print $4 }' | median; }
# halfrtt: median of half of pvctl pingpong's round trips (VM 0).
halfrtt() { echo "$out" | awk '$1 == "vm0:" && /per round trip/ { for (i = 1; i <= NF; i++) if ($i == "µs") { printf "%.2f\n", $(i-1) / 2; break } }' | median; }

declare -A rate lat dbm notes
for size in 64 4096; do
  # Reference: ib_send_bw (CQ moderation 1: QEMU 7.2 completes every send
  # WQE, signaled or not, so perftest's default moderation overflows its CQ)
  # and ib_send_lat (its typical one-way latency), VM 0 the server.
  mapfile -t cmds < <(reps @0 ib_send_bw -x 1 -Q 1 -n "$MSGS" -s "$size" + @1 retry ib_send_bw -x 1 -Q 1 -n "$MSGS" -s "$size" 192.168.100.1)
  run "reference ib_send_bw $size B" -ref 2 -- "${cmds[@]}"
  rate[ref,$size]=$(echo "$out" | awk -v s="$size" '$1 == "vm1:" && $2 == s && NF == 6 { printf "%.0f\n", $6 * 1e6 }' | median)
  dbm[ref,$size]=$(dbpm $((REPS * MSGS)))
  notes[ref,$size]=$(kinds)
  mapfile -t cmds < <(reps @0 ib_send_lat -x 1 -n "$ITERS" -s "$size" + @1 retry ib_send_lat -x 1 -n "$ITERS" -s "$size" 192.168.100.1)
  run "reference ib_send_lat $size B" -ref 2 -- "${cmds[@]}"
  lat[ref,$size]=$(echo "$out" | awk -v s="$size" '$1 == "vm1:" && $2 == s && NF >= 10 { print $6 }' | median)

  # vfrdma: pvctl bench (VM 1 sends, VM 0 receives and reposts its receives
  # in chains), one doorbell per message (batch 1) and per 32; pvctl
  # pingpong (half its round trip is what ib_send_lat reports). Without
  # and with the POLL doorbell (--poll-doorbell: an empty poll rings it, as
  # rdma-core's provider does; CQs are then never armed).
  for mode in vf vfpd; do
    flags=()
    [ $mode = vfpd ] && flags=(--poll-doorbell)
    for batch in 1 32; do
      run "vfrdma $mode bench batch $batch $size B" -- bench --vm --rc --size "$size" --messages "$MSGS" \
        --batches "$(reps "$batch" | grep -v '^+$' | paste -sd,)" --window "$WINDOW" "${flags[@]}"
      rate[$mode$batch,$size]=$(benchrate "$batch")
      dbm[$mode$batch,$size]=$(dbpm $((REPS * MSGS)))
      notes[$mode$batch,$size]=$(kinds)
    done
    [ $mode = vfpd ] && flags+=(--spin)
    mapfile -t cmds < <(reps pingpong --vm --tag r%R --rc --size "$size" --iters "$ITERS" "${flags[@]}")
    run "vfrdma $mode pingpong $size B" -- "${cmds[@]}"
    lat[$mode,$size]=$(halfrtt)
  done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
row() { printf "| %-6s | %-50s | %10s | %10s | %13s | %-10s |\n" "$@"; }
int() { [ "$1" = - ] && echo - || printf "%.0f" "$1"; }
echo
echo "RC SEND between two guests on the same bench (QEMU 7.2 pvrdma under TCG, the softverbs backend)"
echo "medians of $REPS runs: $MSGS messages per rate run, $WINDOW in flight; $ITERS iterations per latency run;"
echo "doorbells: every kind both devices received in the rate runs (QEMU's pvrdma_uar_write), per message"
echo
row size stack "msg/s" "latency µs" "doorbells/msg" "vfrdma/ref"
printf "|%s|%s|%s|%s|%s|%s|\n" -------- ---------------------------------------------------- ------------ ------------ --------------- ------------
for size in 64 4096; do
  r=${rate[ref,$size]}
  row "$size" "reference: ib_send_bw / ib_send_lat" "$(int "$r")" "${lat[ref,$size]}" "${dbm[ref,$size]}" ""
  row "$size" "vfrdma: bench batch 1 / pingpong" "$(int "${rate[vf1,$size]}")" "${lat[vf,$size]}" "${dbm[vf1,$size]}" "$(ratio "${rate[vf1,$size]}" "$r")"
  row "$size" "vfrdma: bench batch 32" "$(int "${rate[vf32,$size]}")" "" "${dbm[vf32,$size]}" "$(ratio "${rate[vf32,$size]}" "$r")"
  row "$size" "vfrdma --poll-doorbell: batch 1 / pingpong --spin" "$(int "${rate[vfpd1,$size]}")" "${lat[vfpd,$size]}" "${dbm[vfpd1,$size]}" "$(ratio "${rate[vfpd1,$size]}" "$r")"
  row "$size" "vfrdma --poll-doorbell: batch 32" "$(int "${rate[vfpd32,$size]}")" "" "${dbm[vfpd32,$size]}" "$(ratio "${rate[vfpd32,$size]}" "$r")"
done
echo
echo "Doorbells by kind, both VMs, all $REPS rate runs ($((REPS * MSGS)) messages):"
for size in 64 4096; do
  for k in ref vf1 vf32 vfpd1 vfpd32; do
    echo "  $size B $k: ${notes[$k,$size]}"
  done
done
