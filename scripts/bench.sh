#!/usr/bin/env bash
# make bench: the comparisons, vfrdma beside the reference stack (Linux's
# vmw_pvrdma + rdma-core, perftest: scripts/sidebyside.sh) and beside UCX's
# active messages (scripts/amside.sh), on the same bench; their tables and
# charts go into a results folder, one per run of this script:
# build/bench-results/<run>/ (build/bench-results/latest is the newest; the
# last 30 are kept), like make test's logs. Per comparison: NAME.txt (the
# tables), NAME.tsv (their figures, for the charts), NAME.log (its progress
# and failures), NAME-*.svg (internal/tools/benchchart's charts); and
# summary.md, the tables with their charts. docs/benchmarks.md opens with
# the latest recorded ones.
#
# Before it starts it says about how long it will take: the last run's
# pace if a results folder has one, else this bench's on a quiet two-core
# machine; each comparison says which run of how many it is on.
#
# Usage: scripts/bench.sh [-r ROUNDS] [--short] [sidebyside] [amside]
#   -r ROUNDS  rounds of each comparison, medians over them (default 5)
#   --short    a short variant, for a look (fewer messages, 1 round); its
#              results say so in their command line
#   NAME...    only these comparisons (default both)
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
# The comparisons and the chart tool; the script's own tests put stand-ins
# here.
SIDEBYSIDE=${BENCH_SIDEBYSIDE:-scripts/sidebyside.sh}
AMSIDE=${BENCH_AMSIDE:-scripts/amside.sh}
CHART=${BENCH_CHART:-$GO run ./internal/tools/benchchart}
RESULTS=${BENCH_RESULTS:-$PWD/build/bench-results}
# Seconds per round on a quiet two-core machine: the side-by-side's 30
# two-VM boots, am beside UCX's 10 boots and 7 host runs (from make demo
# when it held both, three rounds each: 1 010 s in all, the rest of the
# demo about 120 s).
declare -A PACE=([sidebyside]=150 [amside]=110)

usage() { sed -n 's/^# \{0,1\}//; /^Usage:/,/^[^ ]/p' scripts/bench.sh | sed '$d'; }
die() { echo "bench: $*" >&2; usage >&2; exit 2; }

ROUNDS=5 SHORT=0 parts=()
while [ $# -gt 0 ]; do
  case $1 in
  -r | --rounds)
    [ $# -ge 2 ] || die "$1 needs a number of rounds"
    [[ $2 =~ ^[1-9][0-9]{0,2}$ ]] || die "rounds must be a whole number from 1 to 999, not '$2'"
    ROUNDS=$2; shift 2 ;;
  --short) SHORT=1; shift ;;
  -h | --help) usage; exit 0 ;;
  sidebyside | amside)
    [[ " ${parts[*]} " = *" $1 "* ]] || parts+=("$1"); shift ;;
  *) die "unknown argument '$1'" ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || parts=(sidebyside amside)
[ "$SHORT" = 1 ] && ROUNDS=1

# cmd PART: the comparison's command line. The side-by-side runs ROUNDS
# untraced rounds and one traced; --short shrinks the messages.
cmd() {
  case $1 in
  sidebyside) if [ "$SHORT" = 1 ]; then echo "$SIDEBYSIDE 2000 100 1"; else echo "$SIDEBYSIDE 20000 1000 $ROUNDS"; fi ;;
  amside) if [ "$SHORT" = 1 ]; then echo "ITERS=100 MSGS=1000 BWMSGS=8 $AMSIDE 1"; else echo "$AMSIDE $ROUNDS"; fi ;;
  esac
}
# rounds PART: the rounds the comparison runs.
rounds() { if [ "$1" = sidebyside ]; then echo $((ROUNDS + 1)); else echo "$ROUNDS"; fi; }

# The estimate: the pace (seconds per round) of the newest run of the same
# kind (full or short) that recorded one, else the quiet machine's. A
# short round boots as many VMs as a full one, and the boots are most of
# a round's time, so it is taken at the same pace.
kind=full
[ "$SHORT" = 1 ] && kind=short
total=0 est=()
for p in "${parts[@]}"; do
  pace=${PACE[$p]} from="a quiet two-core machine"
  last=$(ls -1d "$RESULTS"/2*/ 2>/dev/null | sort -r | while read -r d; do
    awk -v p="$p" -v k="$kind" '$1 == p && $4 == k && $5 == 0 && $2 > 0 { printf "%d %s\n", $3 / $2, FILENAME; exit }' "$d/pace" 2>/dev/null
  done | awk 'NR == 1')
  if [ -n "$last" ]; then pace=${last%% *} from="the run in ${last#* }"; from=${from%/pace}; fi
  s=$((pace * $(rounds "$p")))
  total=$((total + s))
  est+=("$p: $(rounds "$p") round(s), about $((s / 60 + 1)) min (pace of $from)")
done

stamp=$(date +%Y%m%d-%H%M%S)-$$
dir=$RESULTS/$stamp
mkdir -p "$dir" || { echo "bench: cannot create $dir" >&2; exit 1; }
ln -sfn "$stamp" "$RESULTS/latest"
ls -1d "$RESULTS"/2*/ 2>/dev/null | head -n -30 | xargs -r rm -rf

echo "bench: ${parts[*]}$([ "$SHORT" = 1 ] && echo ", short variant"): about $((total / 60 + 1)) min in all, longer on a loaded machine"
for e in "${est[@]}"; do echo "  $e"; done
echo "bench: results in ${dir#"$PWD"/}"

failed=() t0=$SECONDS
for p in "${parts[@]}"; do
  c=$(cmd "$p")
  echo
  echo "=== $p: $c"
  s0=$SECONDS
  # The tables to the terminal and NAME.txt, the progress to the terminal
  # and NAME.log; the figures to NAME.tsv.
  # shellcheck disable=SC2086 # the command's words
  env TSV="$dir/$p.tsv" GO="$GO" $c 2> >(tee "$dir/$p.log" >&2) | tee "$dir/$p.txt"
  rc=${PIPESTATUS[0]}
  secs=$((SECONDS - s0))
  echo "$p $(rounds "$p") $secs $kind $rc" >> "$dir/pace"
  if [ "$rc" != 0 ] || [ ! -s "$dir/$p.tsv" ]; then
    echo "=== $p: FAILED ($rc) after ${secs}s; its log: ${dir#"$PWD"/}/$p.log"
    failed+=("$p")
    continue
  fi
  echo "=== $p: done in ${secs}s"
  # shellcheck disable=SC2086 # the command's words
  if ! $CHART -o "$dir" "$dir/$p.tsv" > "$dir/$p.charts"; then
    echo "=== $p: the charts failed"
    failed+=("$p charts")
  fi
done

# summary.md: each comparison's tables and charts, for a reader of the
# folder (a Markdown viewer shows the SVGs).
{
  echo "# make bench, $(date -u '+%Y-%m-%d %H:%M UTC')"
  for p in "${parts[@]}"; do
    echo
    echo "## $p: \`$(cmd "$p")\`"
    echo
    [ -s "$dir/$p.txt" ] && sed 's/^/    /' "$dir/$p.txt"
    if [ -s "$dir/$p.charts" ]; then
      echo
      while read -r f; do echo "![$(basename "$f" .svg)]($(basename "$f"))"; done < "$dir/$p.charts"
    fi
  done
} > "$dir/summary.md"

echo
echo "bench: done in $(((SECONDS - t0) / 60)) min $(((SECONDS - t0) % 60)) s; tables, charts and summary.md in ${dir#"$PWD"/}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "bench: failed: ${failed[*]}"
  exit 1
fi
