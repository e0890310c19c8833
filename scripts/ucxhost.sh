#!/usr/bin/env bash
# ucxhost.sh TEST SIZE N: one ucx_perftest run (ucp_am_lat, ucp_am_bw, ...:
# TEST with SIZE-byte messages, N iterations) between two processes on this
# host over the softverbs backend, no emulator between them: the floor the
# backend sets for UCX. Prints the client's output (its "Final:" line has
# the figures); exits with the client's status.
#
# UCX opens an IB device only if /dev/infiniband/<device> is a character
# device it may read and write; softverbs has no kernel part and so no such
# node. The run therefore gets a private mount namespace whose /dev is an
# overlay (over the host's /dev, which it leaves untouched) holding
# /dev/infiniband/softverbs0: a second name for /dev/null (1:3), which
# nothing opens; softverbs talks over its own unix sockets.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# = 3 ] || { echo "usage: scripts/ucxhost.sh TEST SIZE N" >&2; exit 2; }
SV=$PWD/build/softverbs
[ -e "$SV/libibverbs.so.1" ] || { echo "ucxhost: no backend in $SV: run make softverbs first" >&2; exit 1; }
command -v ucx_perftest >/dev/null || { echo "ucxhost: ucx_perftest is missing: run make setup first (ucx-utils)" >&2; exit 1; }
if [ "${UCXHOST_NS:-}" != 1 ]; then
  exec env UCXHOST_NS=1 unshare -m --propagation private bash "$0" "$@"
fi
. scripts/ucx-env.sh
ucx_env softverbs0
t=$(mktemp -d)
srv=
cleanup() {
  [ -n "$srv" ] && kill "$srv" 2>/dev/null
  umount -l /dev "$t" 2>/dev/null
  rmdir "$t" 2>/dev/null
}
trap 'st=$?; cleanup; exit $st' EXIT
mount -t tmpfs ucxhost "$t"
mkdir "$t/upper" "$t/work" "$t/fabric"
mount -t overlay ucxhost -o "lowerdir=/dev,upperdir=$t/upper,workdir=$t/work" /dev
mkdir -p /dev/infiniband
mknod -m 666 /dev/infiniband/softverbs0 c 1 3
export LD_LIBRARY_PATH=$SV SOFTVERBS_FABRIC=$t/fabric
port=$((20000 + $$ % 20000))
env "${UCX_ENV[@]}" SOFTVERBS_NODE=ucxserver ucx_perftest -p "$port" -t "$1" -s "$2" -n "$3" >"$t/server.log" 2>&1 &
srv=$!
# The client retries until the server listens (at most 10 s).
for try in $(seq 50); do
  if out=$(env "${UCX_ENV[@]}" SOFTVERBS_NODE=ucxclient ucx_perftest 127.0.0.1 -p "$port" -t "$1" -s "$2" -n "$3" 2>&1); then
    echo "$out"
    wait "$srv"
    srv=
    exit 0
  fi
  kill -0 "$srv" 2>/dev/null || break
  sleep 0.2
done
echo "$out"
echo "ucxhost: the client failed ($try tries); the server said:" >&2
tail -5 "$t/server.log" >&2
exit 1
