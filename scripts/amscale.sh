#!/usr/bin/env bash
# amscale.sh [TASKS...]: how an am job's cost grows with its tasks. For
# each count (default 2 8 32 64), Open MPI's mpirun starts that many
# `pvctl am --launcher` processes on one host, each with its own device
# model (v20) on one fabric directory, for an all-to-all of MESSAGES
# (default 20) 8-byte and 4 KiB messages to every other task; every byte
# and counter is checked. Prints one row per count: the job's set-up
# (median over tasks: device open, address exchange, a QP per peer
# connected, first Barrier), messages/s in all (every message sent, over
# the span from the first task's first send to the last task's last
# arrival) and per task,
# peak resident memory per task (median), QPs per device (am makes one
# per peer and two to itself). Run from the repository root; needs
# python3 for the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
MESSAGES=${MESSAGES:-20}
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(2 8 32 64)
pv=$PWD/build/pvctl-scale
$GO build -o "$pv" ./cmd/pvctl
printf '%-6s %-12s %-14s %-14s %-14s %-12s\n' tasks set-up_s msg/s/task msg/s_total rss_MiB/task QPs/device
for n in "${counts[@]}"; do
  dir=$(mktemp -d /tmp/vfrdma-scale.XXXXXX)
  port=$((20000 + RANDOM % 20000))
  timeout 900 mpirun --allow-run-as-root --oversubscribe -n "$n" -x VFRDMA_AM_ADDR=127.0.0.1:$port \
    "$pv" --model v20 --fabric "$dir" --json am --launcher --sizes 8,4096 --messages "$MESSAGES" --stall 60s \
    >"$dir/out" 2>"$dir/err" || { tail -5 "$dir/err"; echo "amscale: the $n-task job failed"; exit 1; }
  python3 - "$n" "$dir/out" <<'PY'
import json, statistics, sys
n = int(sys.argv[1])
text, dec, rows, i = open(sys.argv[2]).read(), json.JSONDecoder(), [], 0
while True:
    i = text.find('{', i)
    if i < 0:
        break
    obj, i = dec.raw_decode(text, i)
    rows.append(obj)
assert len(rows) == n, f"{len(rows)} reports of {n}"
med = lambda k: statistics.median(r[k] for r in rows)
span = max(r['end_unix'] for r in rows) - min(r['start_unix'] for r in rows)
total = sum(r['sent'] for r in rows) / span  # each message once: sent by one task
print(f"{n:<6} {med('setup_seconds'):<12.2f} {total/n:<14.0f} {total:<14.0f} {med('max_rss_kib')/1024:<14.1f} {n+1:<12}")
PY
  rm -rf "$dir"
done
