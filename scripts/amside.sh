#!/usr/bin/env bash
# Active messages side by side: UCX (ucx_perftest ucp_am_lat / ucp_am_bw,
# UCX 1.13 over rc_verbs on Linux's vmw_pvrdma, in two reference guests),
# the same UCX over vfrdma (the same ucx_perftest in two vfrdma guests
# through the drop-in libibverbs: make dropin) and vfrdma's am (pvctl am
# --vm, in two vfrdma guests), on the same bench
# and the same emulated device, 8 B, 4 KiB, 64 KiB and 1 MiB; and, for the
# floor the backend sets, UCX between two processes on the host over the
# backend with no emulator (scripts/ucxhost.sh). Every figure is the
# median of REPS runs, with the range beside it; the runs are interleaved
# (round r runs UCX at every size, then UCX over vfrdma, then am unchecked and checked, then UCX on the host), so the
# bench's drift over the invocation falls on all alike. A UCX size that
# fails shows "failed" in its rows; the script goes on.
#
# ucx_perftest's ucp_am_lat reports one-way latency (half its round trip):
# the round trips here are twice its average (am's µs/round trip is a mean
# too). UCX's settings for this device, and why each, are in
# scripts/ucx-env.sh.
#
# With TSV=FILE it writes the table's figures to FILE too, each with its
# runs' median, range and count, for internal/tools/benchchart's charts
# (make bench does). Each run says on stderr which of how many it is.
# Usage: scripts/amside.sh [REPS]   (ITERS, MSGS, BWMSGS in the environment)
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchstat.sh
. scripts/benchstat.sh
GO=${GO:-go}
REPS=${1:-5}
ITERS=${ITERS:-500}    # round trips per latency run
MSGS=${MSGS:-5000}     # messages per rate run
BWMSGS=${BWMSGS:-32}   # 1 MiB messages per bandwidth run
SIZES=(8 4096 65536)
BW=1048576
. scripts/ucx-env.sh
ucx_env vmw_pvrdma0
UCX=("${UCX_ENV[@]}")
ucx_env vfrdma0 0 # the drop-in's device; vfrdma binds its GID at index 0
UCXV=("${UCX_ENV[@]}")
# UCX lists an IB device only if /dev/infiniband/<its dev_name> is a
# character device; a vfrdma guest has none (no kernel RDMA stack), so
# the drop-in's uverbs0 is made a link to /dev/vfio/vfio (scripts/test.sh's
# dropin tier says more).
UCXV_PRE=(mkdir -p /dev/infiniband + ln -sf /dev/vfio/vfio /dev/infiniband/uverbs0)
NO_PRE=()
SERVER=192.168.100.1

# run ARGS...: one two-VM pvvm run; its output in $out; its status returned.
run() { out=$($GO run ./cmd/pvvm -vms 2 "$@" 2>&1); }
declare -A vals failed
add() { [ -n "$2" ] && [ "$2" != - ] && vals[$1]+="$2"$'\n'; return 0; }
# finals N: field N of the client's (VM 1) "Final:" lines, in order.
finals() { echo "$out" | awk -v n="$1" '$1 == "vm1:" && $2 == "Final:" { print $n }'; }
# hostfinal N: field N of a host run's "Final:" line.
hostfinal() { echo "$out" | awk -v n="$1" '$1 == "Final:" { print $n }'; }
# amrow TEST SIZE N: field N of pvctl am's row (the driving task, VM 1).
amrow() { echo "$out" | awk -v t="$1" -v s="$2" -v n="$3" '$1 == "vm1:" && $2 == t && $3 == s && $4 ~ /^[0-9]+$/ { print $n }'; }

# ucx_sizes KEY PRE PVVM-FLAGS... -- ENV...: UCX at every size, one boot
# per size, latency then rate (1 MiB: bandwidth only), after the commands
# in the array named PRE (in both VMs); VM 0 serves, VM 1 is the client
# and prints the table. A size that fails is noted in failed[KEY,SIZE].
ucx_sizes() {
  local key=$1 flags=() env size t k j all n lat mbs rate
  local -n pre=$2
  shift 2
  while [ "$1" != -- ]; do flags+=("$1"); shift; done
  shift
  env=("$@")
  for size in "${SIZES[@]}" "$BW"; do
    tests=(ucp_am_lat ucp_am_bw)
    [ "$size" = "$BW" ] && tests=(ucp_am_bw)
    # The server's commands in VM 0, the client's in VM 1, each VM's in
    # order; a client retries until its server listens.
    all=() n=()
    for t in "${tests[@]}"; do
      k=$MSGS
      [ "$t" = ucp_am_lat ] && k=$ITERS
      [ "$size" = "$BW" ] && k=$BWMSGS
      all+=(+ @0 "${env[@]}" ucx_perftest -t "$t" -s "$size" -n "$k" + @1 retry "${env[@]}" ucx_perftest "$SERVER" -t "$t" -s "$size" -n "$k")
      n+=("$t")
    done
    all=("${all[@]:1}")
    [ ${#pre[@]} = 0 ] || all=("${pre[@]}" + "${all[@]}")
    progress "$key at $size B"
    if ! run "${flags[@]}" -- "${all[@]}"; then
      failed[$key,$size]=1
      echo "amside: $key at $size B failed; the last lines:" >&2
      echo "$out" | grep -v 'QEMU stack' | tail -8 >&2
    fi
    # The client's Final lines, in the order of its tests: field 5 is the
    # one-way average latency (lat) or overhead (bw), 7 MB/s, 9 msg/s.
    mapfile -t lat < <(finals 5)
    mapfile -t mbs < <(finals 7)
    mapfile -t rate < <(finals 9)
    for j in "${!n[@]}"; do
      [ -n "${lat[$j]:-}" ] || continue
      case ${n[$j]} in
      ucp_am_lat) add "$key,rt,$size" "$(awk -v v="${lat[$j]}" 'BEGIN { printf "%.1f\n", 2 * v }')" ;;
      ucp_am_bw) add "$key,rate,$size" "${rate[$j]}"; add "$key,mbs,$size" "${mbs[$j]}" ;;
      esac
    done
  done
}

# Every round: UCX over each stack at every size (a boot each), am
# unchecked and checked, and UCX on the host at every size and test.
progress_init amside $((REPS * (2 * (${#SIZES[@]} + 1) + 2 + 2 * ${#SIZES[@]} + 1)))
for ((rep = 0; rep < REPS; rep++)); do
  # UCX over the kernel stack (two reference guests), then the same over
  # vfrdma (two vfrdma guests, the drop-in).
  ucx_sizes ucx NO_PRE -ref 2 -- "${UCX[@]}"
  ucx_sizes ucxv UCXV_PRE -- "${UCXV[@]}"

  # vfrdma: pvctl am between two vfrdma guests (VM 1 drives): as
  # ucx_perftest runs (the bytes untouched: --check=false), then with its
  # default, every message filled with a pattern and every byte checked.
  sizes=$(IFS=,; echo "${SIZES[*]}")
  for check in false true; do
    key=am
    [ $check = true ] && key=amchk
    progress "pvctl am --check=$check"
    if run -- am --vm --check=$check --sizes "$sizes" --bw-size "$BW" --iters "$ITERS" --messages "$MSGS" --bw-messages "$BWMSGS"; then
      for size in "${SIZES[@]}"; do
        add "$key,rt,$size" "$(amrow latency "$size" 5)"
        add "$key,rate,$size" "$(amrow rate "$size" 5)"
      done
      add "$key,mbs,$BW" "$(amrow bandwidth "$BW" 5)"
    else
      echo "amside: pvctl am --check=$check failed; the last lines:" >&2
      echo "$out" | grep -v 'QEMU stack' | tail -8 >&2
    fi
  done

  # UCX on the host over the backend (Final: field 5 one-way µs, 9 msg/s,
  # 7 MB/s).
  for size in "${SIZES[@]}" "$BW"; do
    for t in ucp_am_lat ucp_am_bw; do
      [ "$size" = "$BW" ] && [ "$t" = ucp_am_lat ] && continue
      k=$MSGS
      [ "$t" = ucp_am_lat ] && k=$ITERS
      [ "$size" = "$BW" ] && k=$BWMSGS
      progress "UCX on the host, $t at $size B"
      if ! out=$(bash scripts/ucxhost.sh "$t" "$size" "$k" 2>&1); then
        echo "amside: UCX on the host, $t at $size B, failed; the last lines:" >&2
        echo "$out" | tail -5 >&2
        continue
      fi
      case $t in
      ucp_am_lat) add "host,rt,$size" "$(awk -v v="$(hostfinal 5)" 'BEGIN { printf "%.1f\n", 2 * v }')" ;;
      ucp_am_bw) add "host,rate,$size" "$(hostfinal 9)"; add "host,mbs,$size" "$(hostfinal 7)" ;;
      esac
    done
  done
done

med() { printf '%s' "${vals[$1]:-}" | median; }
cell() { # KEY FORMAT: "median (min–max)", or "failed" for a UCX size that failed with no figure
  local m; m=$(med "$1")
  if [ "$m" = - ]; then
    case $1 in ucx,* | ucxv,*) [ -n "${failed[${1%%,*},${1##*,}]:-}" ] && { echo failed; return; } ;; esac
    echo -; return
  fi
  local r; r=$(printf '%s' "${vals[$1]}" | spread "$2")
  printf "%$2%s" "$m" "${r:+ ($r)}"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "-" && b != "-" && b > 0) printf "%.2f", a / b; else print "-" }'; }
row() { printf "| %-8s | %-26s | %-26s | %-26s | %-7s | %-26s | %-26s | %-26s | %-7s |\n" "$@"; }
lrow() { printf "| %-8s | %-27s | %-26s | %-26s | %-7s | %-26s | %-26s | %-26s | %-7s |\n" "$@"; } # printf pads bytes: "µ" is two
echo
echo "Active messages between two guests on the same bench (QEMU 7.2 pvrdma under TCG, the softverbs backend):"
echo "UCX 1.13 ucp_am (ucx_perftest, rc_verbs on Linux's vmw_pvrdma) beside vfrdma's am (pvctl am --vm)."
echo "Medians of $REPS interleaved runs (range in brackets); $ITERS round trips per latency run, $MSGS messages per"
echo "rate run, $BWMSGS for 1 MiB. Round trip: am's mean, and twice ucp_am_lat's one-way average."
echo "vfrdma am: pvctl am --check=false, the bytes untouched as ucx_perftest leaves them (am/UCX compares these);"
echo "checked: pvctl am's default, every message filled with a pattern and every byte checked at its target."
echo "UCX on the host: two host processes over the backend, no emulator (scripts/ucxhost.sh)."
echo "UCX over vfrdma: the same ucx_perftest in two vfrdma guests through the drop-in libibverbs (vfrdma0)."
echo
row size figure "UCX ucp_am" "vfrdma am" "am/UCX" "vfrdma am, checked" "UCX on the host" "UCX over vfrdma" "vf/ker"
printf "|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n" ---------- ---------------------------- ---------------------------- ---------------------------- --------- ---------------------------- ---------------------------- ---------------------------- ---------
for size in "${SIZES[@]}"; do
  lrow "$size" "round trip µs (mean)" "$(cell "ucx,rt,$size" .1f)" "$(cell "am,rt,$size" .1f)" "$(ratio "$(med "am,rt,$size")" "$(med "ucx,rt,$size")")" "$(cell "amchk,rt,$size" .1f)" "$(cell "host,rt,$size" .1f)" "$(cell "ucxv,rt,$size" .1f)" "$(ratio "$(med "ucxv,rt,$size")" "$(med "ucx,rt,$size")")"
  row "$size" "msg/s" "$(cell "ucx,rate,$size" .0f)" "$(cell "am,rate,$size" .0f)" "$(ratio "$(med "am,rate,$size")" "$(med "ucx,rate,$size")")" "$(cell "amchk,rate,$size" .0f)" "$(cell "host,rate,$size" .0f)" "$(cell "ucxv,rate,$size" .0f)" "$(ratio "$(med "ucxv,rate,$size")" "$(med "ucx,rate,$size")")"
done
row "$BW" "MB/s" "$(cell "ucx,mbs,$BW" .1f)" "$(cell "am,mbs,$BW" .1f)" "$(ratio "$(med "am,mbs,$BW")" "$(med "ucx,mbs,$BW")")" "$(cell "amchk,mbs,$BW" .1f)" "$(cell "host,mbs,$BW" .1f)" "$(cell "ucxv,mbs,$BW" .1f)" "$(ratio "$(med "ucxv,mbs,$BW")" "$(med "ucx,mbs,$BW")")"
echo
echo "am/UCX: above 1 is am slower for round trips, faster for msg/s and MB/s;"
echo "vf/ker: UCX over vfrdma to UCX over the kernel stack, read the same way."

# The results file: the table's figures.
tsv_start amside "scripts/amside.sh $REPS (ITERS=$ITERS MSGS=$MSGS BWMSGS=$BWMSGS)"
for key in ucx am amchk host ucxv; do
  case $key in
  ucx) name="UCX ucp_am" ;;
  am) name="vfrdma am" ;;
  amchk) name="vfrdma am, checked" ;;
  host) name="UCX on the host" ;;
  ucxv) name="UCX over vfrdma" ;;
  esac
  for size in "${SIZES[@]}"; do
    tsv_row rt µs "$size" "$name" "" "${vals[$key,rt,$size]:-}"
    tsv_row rate msg/s "$size" "$name" "" "${vals[$key,rate,$size]:-}"
  done
  tsv_row mbs MB/s "$BW" "$name" "" "${vals[$key,mbs,$BW]:-}"
done
