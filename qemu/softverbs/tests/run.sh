#!/bin/sh
# Runs the softverbs unit tests and the provider-library checks, then
# rdma-core's ibverbs-utils and perftest's ib_send_bw / ib_send_lat
# between two processes over the backend. Prints "softverbs: N passed,
# M failed" last; exits 1 on any failure. Needs OUT (the build directory).
set -u
: "${OUT:?OUT must name the build directory}"
export LD_LIBRARY_PATH="$OUT"
WORK=$(mktemp -d /tmp/softverbs-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export SOFTVERBS_FABRIC="$WORK/fabric"
unset SOFTVERBS_NODE SOFTVERBS_DEBUG
pass=0
fail=0

ok() { pass=$((pass + 1)); echo "ok $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/    /' "$2"; }

# tally NAME FILE WHAT: adds the "NAME: N passed, M failed" line of FILE to
# the counts, or counts WHAT as failed when the line is missing.
tally() {
	cat "$2"
	line=$(grep "^$1: " "$2" | tail -1)
	if [ -n "$line" ]; then
		p=$(echo "$line" | sed "s/^$1: \([0-9]*\) passed, \([0-9]*\) failed\$/\1/")
		f=$(echo "$line" | sed "s/^$1: \([0-9]*\) passed, \([0-9]*\) failed\$/\2/")
		pass=$((pass + p))
		fail=$((fail + f))
	else
		bad "$3 did not finish"
	fi
}

# ---- unit tests ----
timeout 60 "$OUT/softverbs-test" > "$WORK/unit.out" 2>&1
tally unit "$WORK/unit.out" "unit tests"
# the unit suite again with the library built with AddressSanitizer (a use
# after free in the backend crashes QEMU much later, if at all)
LD_LIBRARY_PATH="$OUT/asan" ASAN_OPTIONS=detect_leaks=0 timeout 90 "$OUT/asan/softverbs-test" > "$WORK/unit-asan.out" 2>&1
tally unit "$WORK/unit-asan.out" "unit tests under ASan"
grep -q 'ERROR: AddressSanitizer' "$WORK/unit-asan.out" && bad "AddressSanitizer reports" "$WORK/unit-asan.out"
# the data-path cases again with an empty poll that only yields (as QEMU runs)
SOFTVERBS_POLL_PROGRESS=0 timeout 60 "$OUT/softverbs-test" rc_loopback rc_window_rnr rc_rnr_retry_after_poll \
	exactly_once ud_loopback srq threads > "$WORK/unit-np.out" 2>&1
tally unit "$WORK/unit-np.out" "unit tests without poll progress"

# ---- rdma-core's provider libraries (as perftest links them) ----
SOFTVERBS_NODE=providers timeout 20 "$OUT/softverbs-providers" > "$WORK/prov.out" 2>&1
tally providers "$WORK/prov.out" "provider checks"

# ---- ibv_devinfo ----
for args in "" "-v"; do
	name="ibv_devinfo $args"
	if SOFTVERBS_NODE=devinfo timeout 10 ibv_devinfo $args > "$WORK/di.out" 2>&1 &&
	   grep -q 'hca_id:[[:space:]]*softverbs0' "$WORK/di.out" &&
	   grep -q 'PORT_ACTIVE' "$WORK/di.out"; then
		ok "$name"
	else
		bad "$name" "$WORK/di.out"
	fi
done
if SOFTVERBS_NODE=devinfo timeout 10 ibv_devinfo -v > "$WORK/di.out" 2>&1 &&
   grep -q 'GID\[  1\]:[[:space:]]*fe80:' "$WORK/di.out"; then
	ok "ibv_devinfo -v shows GID 1"
else
	bad "ibv_devinfo -v shows GID 1" "$WORK/di.out"
fi

# ---- two processes: server and client over loopback TCP, each its own node ----
# TCP ports for the address exchange: a per-run base, away from others' runs
port=$((20000 + $$ % 20000))

# pair PROG ARGS...: runs "PROG -p PORT ARGS" as node server and, once it
# listens, "PROG -p PORT ARGS 127.0.0.1" as node client. Output in
# $WORK/srv.out and $WORK/cli.out, exit statuses in $src and $crc.
pair() {
	prog=$1
	shift
	port=$((port + 1))
	SOFTVERBS_NODE=server timeout 25 "$prog" -p $port "$@" \
		> "$WORK/srv.out" 2>&1 &
	spid=$!
	# the client retries until the server listens
	tries=0
	while :; do
		SOFTVERBS_NODE=client timeout 25 "$prog" -p $port "$@" 127.0.0.1 \
			> "$WORK/cli.out" 2>&1
		crc=$?
		if [ $crc -ne 0 ] && grep -q "Couldn't connect" "$WORK/cli.out" &&
		   [ $tries -lt 50 ]; then
			tries=$((tries + 1))
			sleep 0.1
			continue
		fi
		break
	done
	wait $spid
	src=$?
}

# pair_bad NAME: reports a failed pair run with both outputs.
pair_bad() {
	echo "--- server (rc=$src)" > "$WORK/pp.out"
	cat "$WORK/srv.out" >> "$WORK/pp.out"
	echo "--- client (rc=$crc)" >> "$WORK/pp.out"
	cat "$WORK/cli.out" >> "$WORK/pp.out"
	bad "$1" "$WORK/pp.out"
}

# ---- rdma-core's pingpong programs ----
pingpong() {
	name="$*"
	iters=1000
	case " $* " in *" -n "*) iters=$(echo "$*" | sed 's/.*-n \([0-9]*\).*/\1/') ;; esac
	prog=$1
	shift
	pair "$prog" -g 1 "$@"
	if [ $src -eq 0 ] && [ $crc -eq 0 ] &&
	   grep -q "^$iters iters in" "$WORK/srv.out" &&
	   grep -q "^$iters iters in" "$WORK/cli.out"; then
		ok "$name ($(grep 'iters in' "$WORK/cli.out"))"
	else
		pair_bad "$name"
	fi
}

pingpong ibv_rc_pingpong
pingpong ibv_rc_pingpong -e
pingpong ibv_rc_pingpong -s 1048576 -n 50
pingpong ibv_ud_pingpong
pingpong ibv_ud_pingpong -e
pingpong ibv_srq_pingpong
pingpong ibv_srq_pingpong -e
pingpong ibv_uc_pingpong

# ---- perftest: ib_send_bw and ib_send_lat, RC SEND ----
# -x 1: the node's GID. Left to itself perftest takes index 0 on an
# Ethernet port (no entry is IPv4-mapped or RoCE v2), the placeholder
# that never routes. The figures go into the ok line.
perftest() {
	prog=$1
	size=$2
	iters=$3
	name="$prog -s $size -n $iters"
	pair "$prog" -x 1 -s "$size" -n "$iters"
	# the result row: "<bytes> <iterations> <figures>..."
	srow=$(awk -v s="$size" -v n="$iters" '$1 == s && $2 == n' "$WORK/srv.out")
	crow=$(awk -v s="$size" -v n="$iters" '$1 == s && $2 == n' "$WORK/cli.out")
	case $prog in
	ib_send_bw) # BW peak, BW average [MB/s], MsgRate [Mpps]
		fig=$(echo "$crow" | awk '$5 > 0 { printf "%.0f msg/s, %s MB/s", $5 * 1e6, $4 }') ;;
	*) # t_min, t_max, t_typical, t_avg [usec], ...
		fig=$(echo "$crow" | awk '$5 > 0 { printf "t_typical %s us, t_avg %s us", $5, $6 }') ;;
	esac
	if [ $src -eq 0 ] && [ $crc -eq 0 ] && [ -n "$srow" ] && [ -n "$fig" ]; then
		ok "$name ($fig)"
	else
		pair_bad "$name"
	fi
}

perftest ib_send_bw 64 5000
perftest ib_send_bw 4096 5000
perftest ib_send_lat 64 1000
perftest ib_send_lat 4096 1000

echo "softverbs: $pass passed, $fail failed"
[ $fail -eq 0 ]
