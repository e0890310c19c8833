#!/usr/bin/env bash
# Side by side: the reference stack (Linux's vmw_pvrdma + rdma-core, perftest)
# and vfrdma (pvctl) on the same bench, the same emulated device, RC SEND
# between two guests, 64 B and 4 KiB, the same message counts and the same
# messages in flight; the doorbells each device received, counted on the
# device side (QEMU's trace). vfrdma's defaults come first (no flags: the
# ends poll without sleeping, with the POLL doorbell), then its other
# modes. Every rate and latency is the median of REPS runs, with the range
# beside it; the runs are interleaved (round r runs every configuration
# once, the reference first), so that the bench's drift over the
# invocation falls on both stacks alike. Those runs are not traced: QEMU
# writes a trace line per doorbell from the vCPU thread, which costs a
# stack in proportion to the doorbells it rings per message (ib_send_bw
# 64 B, 2.2 per message, ran at 0.52x with -doorbells; pvctl bench at
# batch 32, 0.12, at 0.93x: docs/benchmarks.md), so a traced rate favours
# whichever stack rings less. The doorbell counts and the round trips'
# breakdown come from one more round, traced.
#
# The same perftest binary runs on both stacks: over the kernel stack in
# the reference guests, and over vfrdma in vfrdma guests through the
# drop-in libibverbs (pvvm carries it: make dropin), ib_send_bw at batch 1
# and with its post list of 32 (-l 32: 32 sends a doorbell), and
# ib_send_lat; those rows compare the stacks with the program's own work
# the same on both.
#
# With TSV=FILE it writes the table's figures to FILE too, each with its
# runs' median, range and count, for internal/tools/benchchart's charts
# (make bench does). Each run says on stderr which of how many it is.
# Usage: scripts/sidebyside.sh [MESSAGES] [ITERS] [REPS]
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchstat.sh
. scripts/benchstat.sh
GO=${GO:-go}
MSGS=${1:-20000}
ITERS=${2:-1000}
REPS=${3:-5}
# Messages in flight: ib_send_bw keeps its tx depth (-t, 128 by default) in
# flight whatever it posts per doorbell; pvctl bench keeps the same.
WINDOW=128
# ib_send_bw -l 32 wants its message count a multiple of its post list.
PLMSGS=$((MSGS / 32 * 32))
PVVM=($GO run ./cmd/pvvm -vms 2)

# run LABEL ARGS...: one pvvm run; its output in $out (and on failure, stderr).
run() {
  local label=$1; shift
  progress "$label"
  if ! out=$("${PVVM[@]}" "$@" 2>&1); then
    echo "sidebyside: the $label run failed:" >&2
    echo "$out" | tail -30 >&2
    exit 1
  fi
}
# dbpm MESSAGES: doorbells of every kind both devices received in the run,
# per message.
dbpm() {
  echo "$out" | sed -n "s/^vm[01]: device-side doorbells (QEMU's pvrdma_uar_write)://p" | tr ' ' '\n' |
    awk -F= -v m="$1" '$2 != "" { s += $2 } END { printf "%.3f\n", s / m }'
}
# kinds: the doorbell counts per kind of both VMs, for the notes.
kinds() { echo "$out" | sed -n "s/^\(vm[01]\): device-side doorbells (QEMU's pvrdma_uar_write):/\1/p" | tr '\n' ';'; }
# benchrate BATCH: the sender's (VM 1) msg/s of that batch.
benchrate() { echo "$out" | awk -v b="$1" '$1 == "vm1:" && $2 == b && NF == 10 { print $4 }'; }
# halfrtt: half of pvctl pingpong's median round trip (VM 0), as
# ib_send_lat's t_typical is half its median; halfmean: half the mean,
# beside ib_send_lat's t_avg.
halfrtt() { echo "$out" | awk '$1 == "vm0:" && /per round trip/ { for (i = 1; i < NF; i++) if ($i == "(median") { printf "%.2f\n", $(i+1) / 2; break } }'; }
halfmean() { echo "$out" | awk '$1 == "vm0:" && /per round trip/ { for (i = 1; i <= NF; i++) if ($i == "µs") { printf "%.2f\n", $(i-1) / 2; break } }'; }
# spans KEY: a -timeline run's round trip broken down (pvvm's medians):
# transit to the server, its turnaround, transit back, the client's
# turnaround, and the round trip.
spans() {
  local i=0 v
  for v in $(echo "$out" | awk '/^  medians µs:/ { print $4, $6, $8, $10, $12 }'); do
    add "$1,$i" "$v"
    i=$((i + 1))
  done
}

# The configurations: a key, pvctl's flags, and the row's name.
# No flags: the ends spin, and an empty poll rings the POLL doorbell, as
# rdma-core's provider and perftest do. --events: they sleep on the CQ's
# interrupt after the driver's spin. --poll-doorbell=false: they spin
# without the doorbell (shown because on this bench it loses: the spinning
# guests take the cores QEMU's device and the backend need).
VF_KEYS=(vf ev sp)
declare -A VF_FLAGS=([vf]="" [ev]="--events" [sp]="--poll-doorbell=false")
declare -A VF_NAME=([vf]="vfrdma, no flags" [ev]="vfrdma --events" [sp]="vfrdma --poll-doorbell=false")

declare -A vals notes
# add KEY VALUE: one run's figure ("" and "-" are dropped).
add() { [ -n "$2" ] && [ "$2" != - ] && vals[$1]+="$2"$'\n'; return 0; }
# perftest_bw KEY SIZE MESSAGES TRACED: an ib_send_bw run's figure: its
# client's (VM 1) msg/s, or traced its doorbells per message.
perftest_bw() {
  if [ "$4" = 1 ]; then
    add "db,$1,$2" "$(dbpm "$3")"
    notes[$1,$2]=$(kinds)
  else
    add "rate,$1,$2" "$(echo "$out" | awk -v s="$2" '$1 == "vm1:" && $2 == s && NF == 6 { printf "%.0f\n", $6 * 1e6 }')"
  fi
}
# perftest_lat KEY SIZE TRACED: an ib_send_lat run's figures: its client's
# (VM 1) t_typical and t_avg, or traced its round trip broken down.
perftest_lat() {
  if [ "$3" = 1 ]; then
    spans "rt,$1,$2"
  else
    add "lat,$1,$2" "$(echo "$out" | awk -v s="$2" '$1 == "vm1:" && $2 == s && NF >= 10 { print $6 }')"
    add "mean,$1,$2" "$(echo "$out" | awk -v s="$2" '$1 == "vm1:" && $2 == s && NF >= 10 { print $7 }')"
  fi
}
# round REP TRACED: every configuration once. Untraced (TRACED=0) it adds
# each run's rate or latency; traced (1: the rate runs with -doorbells, the
# latency runs with -timeline) each run's doorbells and round-trip spans.
round() {
  local rep=$1 traced=$2 size k batch db="" tl=""
  [ "$traced" = 1 ] && db=-doorbells tl=-timeline
  for size in 64 4096; do
    # Reference: ib_send_bw (CQ moderation 1: QEMU 7.2 completes every
    # send WQE, signaled or not, so perftest's default moderation overflows
    # its CQ) and ib_send_lat (its typical one-way latency), VM 0 the
    # server.
    run "reference ib_send_bw $size B" $db -ref 2 -- @0 ib_send_bw -x 1 -Q 1 -n "$MSGS" -s "$size" + @1 retry ib_send_bw -x 1 -Q 1 -n "$MSGS" -s "$size" 192.168.100.1
    perftest_bw ref "$size" "$MSGS" "$traced"
    run "reference ib_send_bw -l 32 $size B" $db -ref 2 -- @0 ib_send_bw -x 1 -Q 1 -l 32 -n "$PLMSGS" -s "$size" + @1 retry ib_send_bw -x 1 -Q 1 -l 32 -n "$PLMSGS" -s "$size" 192.168.100.1
    perftest_bw refl "$size" "$PLMSGS" "$traced"
    run "reference ib_send_lat $size B" $tl -ref 2 -- @0 ib_send_lat -x 1 -n "$ITERS" -s "$size" + @1 retry ib_send_lat -x 1 -n "$ITERS" -s "$size" 192.168.100.1
    perftest_lat ref "$size" "$traced"

    # The same perftest over vfrdma: the drop-in in two vfrdma guests
    # (vfrdma0, its GID at index 0).
    run "perftest over vfrdma ib_send_bw $size B" $db -- @0 ib_send_bw -x 0 -Q 1 -n "$MSGS" -s "$size" + @1 retry ib_send_bw -x 0 -Q 1 -n "$MSGS" -s "$size" 192.168.100.1
    perftest_bw pt1 "$size" "$MSGS" "$traced"
    run "perftest over vfrdma ib_send_bw -l 32 $size B" $db -- @0 ib_send_bw -x 0 -Q 1 -l 32 -n "$PLMSGS" -s "$size" + @1 retry ib_send_bw -x 0 -Q 1 -l 32 -n "$PLMSGS" -s "$size" 192.168.100.1
    perftest_bw pt32 "$size" "$PLMSGS" "$traced"
    run "perftest over vfrdma ib_send_lat $size B" $tl -- @0 ib_send_lat -x 0 -n "$ITERS" -s "$size" + @1 retry ib_send_lat -x 0 -n "$ITERS" -s "$size" 192.168.100.1
    perftest_lat pt "$size" "$traced"

    # vfrdma: pvctl bench (VM 1 sends, VM 0 receives and reposts its
    # receives in chains), one doorbell per message (batch 1) and per 32,
    # each in a boot of its own (the doorbell counts are the boot's); pvctl
    # pingpong (half its round trip is what ib_send_lat reports).
    for k in "${VF_KEYS[@]}"; do
      for batch in 1 32; do
        # shellcheck disable=SC2086 # the flags are words
        run "vfrdma $k bench batch $batch $size B" $db -- bench --vm --tag b$rep --rc --size "$size" --messages "$MSGS" --batches "$batch" --window "$WINDOW" ${VF_FLAGS[$k]}
        if [ "$traced" = 1 ]; then
          add "db,$k$batch,$size" "$(dbpm "$MSGS")"
          notes[$k$batch,$size]=$(kinds)
        else
          add "rate,$k$batch,$size" "$(benchrate "$batch")"
        fi
      done
      # shellcheck disable=SC2086
      run "vfrdma $k pingpong $size B" $tl -- pingpong --vm --tag p$rep --rc --size "$size" --iters "$ITERS" ${VF_FLAGS[$k]}
      if [ "$traced" = 1 ]; then
        spans "rt,$k,$size"
      else
        add "lat,$k,$size" "$(halfrtt)"
        add "mean,$k,$size" "$(halfmean)"
      fi
    done
  done
}
# Every round runs, per size, the reference's and perftest over vfrdma's
# three (ib_send_bw, with -l 32, ib_send_lat) and, per vfrdma mode, two
# benches and a pingpong; REPS rounds untraced, one traced.
progress_init sidebyside $(((REPS + 1) * 2 * (6 + 3 * ${#VF_KEYS[@]})))
for ((rep = 0; rep < REPS; rep++)); do
  round "$rep" 0
done
round "$REPS" 1

med() { printf '%s' "${vals[$1]:-}" | median; }
rng() { printf '%s' "${vals[$1]:-}" | spread "$2"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "-" && b != "-" && b > 0) printf "%.2f", a / b; else print "-" }'; }
int() { [ "$1" = - ] && echo - || printf "%.0f" "$1"; }
cell() { # KEY FORMAT: "median (min–max)"
  local m; m=$(med "$1")
  [ "$m" = - ] && { echo -; return; }
  local r; r=$(rng "$1" "$2")
  printf "%s%s" "$( [ "$2" = .0f ] && int "$m" || echo "$m")" "${r:+ ($r)}"
}
row() { printf "| %-6s | %-44s | %-26s | %-22s | %-22s | %13s | %-10s |\n" "$@"; }
echo
echo "RC SEND between two guests on the same bench (QEMU 7.2 pvrdma under TCG, the softverbs backend)"
echo "medians of $REPS interleaved runs (range in brackets): $MSGS messages per rate run, $WINDOW in flight; $ITERS iterations per latency run;"
echo "one-way latency: half the median round trip (ib_send_lat's t_typical), and half the mean (its t_avg);"
echo "doorbells: every kind both devices received in the traced round's rate run (QEMU's pvrdma_uar_write), per message;"
echo "perftest over vfrdma: the same binaries through the drop-in libibverbs; its -l 32 row's ratio is to the reference's -l 32"
echo
row size stack "msg/s" "one-way µs, median" "one-way µs, mean" "doorbells/msg" "vfrdma/ref"
printf "|%s|%s|%s|%s|%s|%s|%s|\n" -------- ---------------------------------------------- ---------------------------- ------------------------ ------------------------ --------------- ------------
for size in 64 4096; do
  r=$(med "rate,ref,$size")
  row "$size" "reference: ib_send_bw / ib_send_lat" "$(cell "rate,ref,$size" .0f)" "$(cell "lat,ref,$size" .1f)" "$(cell "mean,ref,$size" .1f)" "$(med "db,ref,$size")" ""
  row "$size" "reference: ib_send_bw -l 32" "$(cell "rate,refl,$size" .0f)" "" "" "$(med "db,refl,$size")" ""
  row "$size" "perftest over vfrdma: ib_send_bw / _lat" "$(cell "rate,pt1,$size" .0f)" "$(cell "lat,pt,$size" .1f)" "$(cell "mean,pt,$size" .1f)" "$(med "db,pt1,$size")" "$(ratio "$(med "rate,pt1,$size")" "$r")"
  row "$size" "perftest over vfrdma: ib_send_bw -l 32" "$(cell "rate,pt32,$size" .0f)" "" "" "$(med "db,pt32,$size")" "$(ratio "$(med "rate,pt32,$size")" "$(med "rate,refl,$size")")"
  for k in "${VF_KEYS[@]}"; do
    row "$size" "${VF_NAME[$k]}: batch 1 / pingpong" "$(cell "rate,${k}1,$size" .0f)" "$(cell "lat,$k,$size" .1f)" "$(cell "mean,$k,$size" .1f)" "$(med "db,${k}1,$size")" "$(ratio "$(med "rate,${k}1,$size")" "$r")"
    row "$size" "${VF_NAME[$k]}: batch 32" "$(cell "rate,${k}32,$size" .0f)" "" "" "$(med "db,${k}32,$size")" "$(ratio "$(med "rate,${k}32,$size")" "$r")"
  done
done
echo
echo "One round trip broken down from the two devices' timelines (pvvm -timeline: the host's clock in"
echo "QEMU's trace of each doorbell and CQE; a transit is SEND doorbell → receive CQE in the peer's ring,"
echo "a turnaround is CQE → the guest's next SEND doorbell); µs, the traced round's medians (the trace slows both):"
echo
brow() { printf "| %-6s | %-30s | %-20s | %-20s | %-20s | %-20s | %-20s |\n" "$@"; }
brow size stack "transit to server" "server turnaround" "transit to client" "client turnaround" "round trip"
printf "|%s|%s|%s|%s|%s|%s|%s|\n" -------- -------------------------------- ---------------------- ---------------------- ---------------------- ---------------------- ----------------------
for size in 64 4096; do
  for k in ref pt "${VF_KEYS[@]}"; do
    case $k in
    ref) name=reference ;;
    pt) name="perftest over vfrdma" ;;
    *) name=${VF_NAME[$k]} ;;
    esac
    brow "$size" "$name" "$(cell "rt,$k,$size,0" .1f)" "$(cell "rt,$k,$size,1" .1f)" "$(cell "rt,$k,$size,2" .1f)" "$(cell "rt,$k,$size,3" .1f)" "$(cell "rt,$k,$size,4" .1f)"
  done
done
echo
echo "Doorbells by kind, both VMs, the traced round's rate runs:"
for size in 64 4096; do
  echo "  $size B ref: ${notes[ref,$size]}"
  echo "  $size B ref -l 32: ${notes[refl,$size]}"
  echo "  $size B perftest over vfrdma: ${notes[pt1,$size]}"
  echo "  $size B perftest over vfrdma -l 32: ${notes[pt32,$size]}"
  for k in "${VF_KEYS[@]}"; do
    for batch in 1 32; do
      echo "  $size B $k batch $batch: ${notes[$k$batch,$size]}"
    done
  done
done

# The results file: the table's figures (the breakdown and the doorbells
# by kind stay in the text).
tsv_start sidebyside "scripts/sidebyside.sh $MSGS $ITERS $REPS"
for size in 64 4096; do
  for k in ref pt "${VF_KEYS[@]}"; do
    case $k in
    ref) name=reference b1=ref b32=refl ;;
    pt) name="perftest over vfrdma" b1=pt1 b32=pt32 ;;
    *) name=${VF_NAME[$k]} b1=${k}1 b32=${k}32 ;;
    esac
    tsv_row rate msg/s "$size" "$name" 1 "${vals[rate,$b1,$size]:-}"
    tsv_row rate msg/s "$size" "$name" 32 "${vals[rate,$b32,$size]:-}"
    tsv_row lat µs "$size" "$name" "" "${vals[lat,$k,$size]:-}"
    tsv_row mean µs "$size" "$name" "" "${vals[mean,$k,$size]:-}"
    tsv_row db doorbells/msg "$size" "$name" 1 "${vals[db,$b1,$size]:-}"
    tsv_row db doorbells/msg "$size" "$name" 32 "${vals[db,$b32,$size]:-}"
  done
done
