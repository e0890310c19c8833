#!/usr/bin/env bash
# The spin budget and the POLL doorbell's pace, measured: pvctl bench
# (batches 1 and 32) and pingpong between two guests, 64 B, in one boot per
# configuration per round, the rounds interleaved. Prints one line per run.
# Usage: scripts/waitspin.sh [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
R=${1:-3}
CFG=("--events --wait-spin=-1ns" "--events" "--events --wait-spin=1ms" "--poll-pace=-1ns" "--poll-pace=20us" "" "--poll-pace=200us")
for ((r = 0; r < R; r++)); do
  for c in "${CFG[@]}"; do
    # shellcheck disable=SC2086 # the flags are words
    out=$($GO run ./cmd/pvvm -vms 2 -- bench --vm --tag b$r --rc --size 64 --messages 20000 --batches 1,32 --window 128 $c + \
      pingpong --vm --tag p$r --rc --size 64 --iters 1000 $c 2>&1) || { echo "waitspin: ${c:-default} failed:" >&2; echo "$out" | tail -20 >&2; exit 1; }
    b1=$(echo "$out" | awk '$1 == "vm1:" && $2 == 1 && NF == 10 { print $4 }')
    b32=$(echo "$out" | awk '$1 == "vm1:" && $2 == 32 && NF == 10 { print $4 }')
    rtt=$(echo "$out" | awk '$1 == "vm0:" && /per round trip/ { for (i = 1; i <= NF; i++) if ($i == "µs") print $(i-1) }')
    echo "round $r | ${c:-default} | batch 1 $b1 msg/s | batch 32 $b32 msg/s | round trip $rtt µs"
  done
done
