#!/usr/bin/env bash
# make test: every tier, in order of cost; the summary line comes last.
# Each tier runs even if an earlier one failed, so one run shows everything.
# With arguments, only the named tiers run: scripts/test.sh guest guest-2vm
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
SV_OUT=$PWD/build/softverbs
# The two-VM run: the smoke tests in both VMs, and the tests that need two
# (TestMultiVM3... need three: the active-message job).
TWO_VM_TESTS='^(TestGuest|TestMultiVM[^3])'
THREE_VM_TESTS='^TestMultiVM3'

# The VM tiers' limits, hang guards only: what a test checks is never a
# time. A command (one ping-pong, say) is killed after CMD_LIMIT and then the
# whole run stops within seconds (pvvm -limit): a lost message costs that,
# not the run's limit. The ping-pongs take 1-6 s on a quiet machine and
# ucx_perftest's 1000 round trips about 10 s; on a machine loaded ten times
# over (a fresh clone's make test beside other builds) the same command took
# more than 20 s and the one-VM suite 305 s, so the limits leave room for
# that. The run's limit is the backstop for a guest that stops running
# altogether; GUEST_LIMIT bounds a whole in-guest suite (112 s quiet).
CMD_LIMIT=90s
RUN_LIMIT=15m
GUEST_LIMIT=25m
# HOST_LIMIT is go test's per-package timeout in the host tier, a hang guard
# too: the root package takes about 3 min under -race on a quiet machine and
# 10 at load 20, where go test's default 10 min killed it.
HOST_LIMIT=30m

# pvvm_failure OUT: what a failed pvvm run said: its post-mortem (every VM's
# commands, backend drop counters and console tail, lines "pvvm: ...") and
# its other problem lines.
pvvm_failure() {
  grep -E -- '^pvvm|^vm[0-9]+: .*(exited|never ran|did not finish|reported no|stalled)|QEMU|qemu-system|signal' <<<"$1" | sed -n 1,120p
}

# Interop: a vfrdma guest (VM 0, pvctl pingpong --rdma-core, every byte it
# receives checked) and a reference guest (VM 1, rdma-core's pingpongs),
# both directions, RC and UD, 1000 iterations at 64 B and 4096 B, and
# ibv_srq_pingpong's 16 QPs on an SRQ against pvctl pingpong --srq 16, 500
# round trips of 4096 B; and pvctl eth ping from the vfrdma guest,
# answered by the reference guest's Linux network stack on the vmxnet3
# link.
interop_tier() {
  local out rc cmds=(@0 eth ping --ip 10.10.0.1 --count 5 --size 1000 10.10.0.2 + @1 sleep 6 +) size
  for size in 64 4096; do
    cmds+=(@0 pingpong --rdma-core --listen 0.0.0.0 --rc --size $size --iters 1000 +
           @1 retry ibv_rc_pingpong -g 1 -n 1000 -s $size 192.168.100.1 +
           @1 ibv_rc_pingpong -g 1 -n 1000 -s $size + @0 pingpong --rdma-core --connect 192.168.100.2 --rc --size $size --iters 1000 +
           @0 pingpong --rdma-core --listen 0.0.0.0 --ud --size $size --iters 1000 +
           @1 retry ibv_ud_pingpong -g 1 -n 1000 -s $size 192.168.100.1 +
           @1 ibv_ud_pingpong -g 1 -n 1000 -s $size + @0 pingpong --rdma-core --connect 192.168.100.2 --ud --size $size --iters 1000 +)
  done
  cmds+=(@0 pingpong --rdma-core --srq 16 --listen 0.0.0.0 --size 4096 --iters 500 +
         @1 retry ibv_srq_pingpong -g 1 -q 16 -n 500 -s 4096 192.168.100.1 +
         @1 ibv_srq_pingpong -g 1 -q 16 -n 500 -s 4096 + @0 pingpong --rdma-core --srq 16 --connect 192.168.100.2 --size 4096 --iters 500 +)
  unset 'cmds[${#cmds[@]}-1]' # the last "+"
  out=$($GO run ./cmd/pvvm -vms 2 -ref 1 -timeout $RUN_LIMIT -limit $CMD_LIMIT -counters -- "${cmds[@]}" 2>&1)
  rc=$?
  echo "$out" > "$LOGS/interop-pvvm.log" # the whole run, for a failure's post-mortem
  echo "$out" | grep -E 'pingpong: 1000|SRQ pingpong|iters in|received, 0% loss|backend:'
  [ $rc = 0 ] || { pvvm_failure "$out"; return $rc; }
  grep -q '5 sent, 5 received' <<<"$out" || { echo "the reference guest did not answer the vfrdma guest's pings"; return 1; }
  [ "$(echo "$out" | grep -c 'every byte checked')" = 10 ] || { echo "not every vfrdma pingpong finished"; return 1; }
  [ "$(echo "$out" | grep -c 'iters in')" = 10 ] || { echo "not every rdma-core pingpong finished"; return 1; }
}

# The reference stack (Linux's vmw_pvrdma + rdma-core) in two guests on the
# same bench: the device as the standard stack sees it, and the standard
# programs between the guests. Every program must exit 0, and the port
# must read ACTIVE in both. The first client waits 6 s after boot, as in the
# interop tier: right after a reference guest boots, rdma-core's client can
# fail after its exchange with the server (ibv_ud_pingpong: "Failed to
# create AH"), and the retry then finds the server no longer listening.
# UCX's ucp_am_lat (ucx_perftest) between the guests, with the settings
# UCX needs on this device (scripts/ucx-env.sh says why each): the
# per-command environment and UCX's dlopen'd transport reaching the guest.
reference_tier() {
  local out rc
  local UCX_ENV
  . scripts/ucx-env.sh
  ucx_env vmw_pvrdma0
  local ucx=("${UCX_ENV[@]}")
  out=$($GO run ./cmd/pvvm -vms 2 -ref 2 -doorbells -timeout $RUN_LIMIT -limit $CMD_LIMIT -counters -- \
    ibv_devinfo -v + @1 sleep 6 + \
    @0 ibv_rc_pingpong -g 1 -n 1000 -s 4096 + @1 retry ibv_rc_pingpong -g 1 -n 1000 -s 4096 192.168.100.1 + \
    @0 ibv_ud_pingpong -g 1 -n 1000 -s 2048 + @1 retry ibv_ud_pingpong -g 1 -n 1000 -s 2048 192.168.100.1 + \
    @0 ib_send_lat -x 1 -n 1000 -s 64 + @1 retry ib_send_lat -x 1 -n 1000 -s 64 192.168.100.1 + \
    @0 ib_send_bw -x 1 -Q 1 -n 5000 -s 64 + @1 retry ib_send_bw -x 1 -Q 1 -n 5000 -s 64 192.168.100.1 + \
    @0 "${ucx[@]}" ucx_perftest -t ucp_am_lat -s 8 -n 1000 + @1 retry "${ucx[@]}" ucx_perftest 192.168.100.1 -t ucp_am_lat -s 8 -n 1000 2>&1)
  rc=$?
  echo "$out" > "$LOGS/reference-pvvm.log" # the whole run, for a failure's post-mortem
  echo "$out" | grep -E 'PORT_ACTIVE|usec/iter|^vm.:  *(64|4096) |^vm1: Final:|doorbells|backend:'
  [ $rc = 0 ] || { pvvm_failure "$out"; return $rc; }
  [ "$(echo "$out" | grep -c 'state:.*PORT_ACTIVE')" = 2 ] || { echo "the port is not ACTIVE in both reference guests"; return 1; }
  [ "$(echo "$out" | grep -c 'iters in')" = 4 ] || { echo "a pingpong did not report its iterations"; return 1; }
  [ "$(echo "$out" | grep -c '^vm1: Final: *1000 ')" = 1 ] || { echo "ucx_perftest's client did not report its 1000 iterations"; return 1; }
}

# rdma-core's, perftest's and UCX's programs, unmodified, in vfrdma guests
# over the drop-in libibverbs (make dropin; pvvm carries it and runs the
# program with LD_LIBRARY_PATH at it): VMs 0 and 1 are vfrdma guests (the
# device is vfrdma0, its one GID fe80::<MAC> at index 0: -g 0, -x 0), VM 2
# a reference guest (vmw_pvrdma0). ibv_devinfo -v in both vfrdma guests
# (port ACTIVE); then, for each of ibv_rc_pingpong, ibv_ud_pingpong,
# ibv_srq_pingpong, ib_send_lat and ib_send_bw, three pairs in a cycle: A
# vfrdma↔vfrdma (server VM 1), B vfrdma client against the reference
# server (VM 2), C reference client against the vfrdma server (VM 0); last
# ucx_perftest's ucp_am_lat vfrdma↔vfrdma. The cycle keeps one boot of
# three VMs busy: each pair needs a VM of the one before, and the VM the
# pair before left idle is the next pair's server, listening by the time
# its client comes (so a server waits at most one pair, well within
# CMD_LIMIT; a client retries while its server is not up yet).
#
# The reference guest's GIDs: 0 fe80::<MAC> never routes on the bench, 1
# is its IPv4 address (::ffff:10.10.0.3), which rdma-core's pingpongs use
# (-g 1) against vfrdma's fe80 GID. perftest refuses a peer whose GID is
# not of its own kind (IPv4-mapped or not: "Found Incompatibility issue
# with GID types"), and vfrdma0 has no IPv4 GID (the reference kernel
# would resolve one by ARP, which no vfrdma guest answers), so the
# reference guest gets an IPv6 address on its vmxnet3 interface (eth1;
# nodad: usable at once), whose GID (index 2) perftest uses (-x 2) against
# vfrdma's fe80 GID, which the kernel resolves without ARP.
#
# UCX's uct_ib lists an IB device only if /dev/infiniband/<its dev_name>
# is a character device the process may read and write; a vfrdma guest
# has no kernel RDMA stack and so no /dev/infiniband: the drop-in's
# vfrdma0 names uverbs0, which the tier makes a link to /dev/vfio/vfio (a
# character device UCX only checks, never opens).
#
# Every program must exit 0, each pingpong report its iterations on both
# sides, each perftest its result row on both sides, UCX's client its 1000
# iterations. The same cycle with reference guests in all three VMs took
# 44 s on a quiet machine.
dropin_tier() {
  local out rc k
  local UCX_ENV
  . scripts/ucx-env.sh
  ucx_env vfrdma0 0
  local ucx=("${UCX_ENV[@]}")
  local -A vf ref
  vf[rc]="ibv_rc_pingpong -g 0 -n 200 -s 4096"  ref[rc]="ibv_rc_pingpong -g 1 -n 200 -s 4096"
  vf[ud]="ibv_ud_pingpong -g 0 -n 200 -s 1024"  ref[ud]="ibv_ud_pingpong -g 1 -n 200 -s 1024"
  vf[srq]="ibv_srq_pingpong -g 0 -q 16 -n 200 -s 4096"  ref[srq]="ibv_srq_pingpong -g 1 -q 16 -n 200 -s 4096"
  vf[lat]="ib_send_lat -x 0 -n 1000 -s 64"      ref[lat]="ib_send_lat -x 2 -n 1000 -s 64"
  vf[bw]="ib_send_bw -x 0 -n 1000 -s 64"        ref[bw]="ib_send_bw -x 2 -Q 1 -n 1000 -s 64"
  local cmds=(@0,1 ibv_devinfo -v + @0,1 mkdir -p /dev/infiniband + @0,1 ln -sf /dev/vfio/vfio /dev/infiniband/uverbs0 +
              @2 ip -6 addr add fd00:10::3/64 dev eth1 nodad + @2 sleep 6 +)
  for k in rc ud srq lat bw; do
    # shellcheck disable=SC2206 # the programs' words
    cmds+=(@1 ${vf[$k]} + @0 retry ${vf[$k]} 192.168.100.2 +
           @2 ${ref[$k]} + @1 retry ${vf[$k]} 192.168.100.3 +
           @0 ${vf[$k]} + @2 retry ${ref[$k]} 192.168.100.1 +)
  done
  cmds+=(@1 "${ucx[@]}" ucx_perftest -t ucp_am_lat -s 8 -n 1000 + @0 retry "${ucx[@]}" ucx_perftest 192.168.100.2 -t ucp_am_lat -s 8 -n 1000)
  out=$($GO run ./cmd/pvvm -vms 3 -ref 1 -timeout $RUN_LIMIT -limit $CMD_LIMIT -counters -- "${cmds[@]}" 2>&1)
  rc=$?
  echo "$out" > "$LOGS/dropin-pvvm.log" # the whole run, for a failure's post-mortem
  echo "$out" | grep -E 'hca_id|PORT_ACTIVE|iters in|^vm.: +(64|4096) +1000 |^vm0: Final:|backend:|^pvvm: +vm'
  [ $rc = 0 ] || { pvvm_failure "$out"; return $rc; }
  local vm
  for vm in 0 1; do
    grep -q "^vm$vm: hca_id:.*vfrdma0" <<<"$out" || { echo "vm$vm: ibv_devinfo over the drop-in did not list vfrdma0"; return 1; }
    grep -Eq "^vm$vm:[[:space:]]+state:.*PORT_ACTIVE" <<<"$out" || { echo "vm$vm: the port of vfrdma0 is not ACTIVE"; return 1; }
  done
  for vm in 0 1 2; do
    # rc, ud and srq in two pairs each, the iterations on both sides
    [ "$(grep -c "^vm$vm: .*iters in" <<<"$out")" = 6 ] || { echo "vm$vm: not every pingpong reported its iterations"; return 1; }
    # ib_send_lat and ib_send_bw in two pairs each, a result row on both
    # sides (or the report perftest could not make, see pvvm's
    # perftestNoReport, after its traffic completed)
    [ "$(grep -Ec "^vm$vm: +64 +1000 |^vm$vm: .*Can't produce a report" <<<"$out")" = 4 ] || { echo "vm$vm: not every perftest reported its result"; return 1; }
  done
  [ "$(grep -c '^vm0: Final: *1000 ' <<<"$out")" = 1 ] || { echo "ucx_perftest's client did not report its 1000 iterations"; return 1; }
}

# A lost datagram must fail the run within seconds and say where: the
# backend loses one UD datagram on purpose (its SOFTVERBS_DROP_UD hook) in a
# vfrdma-to-rdma-core UD ping-pong; pvctl must report the stall with its
# queues' state, the run must stop long before its limit, and the
# post-mortem must name the command and the drop counter.
lossy_tier() {
  local out rc t0=$SECONDS
  # The client waits 6 s after boot, as in the interop tier: right after a
  # reference guest boots, ibv_ud_pingpong can get "Failed to create AH"
  # after its exchange with the server, and the retry then finds the
  # server no longer listening (seen in a fresh-clone run of this tier).
  out=$($GO run ./cmd/pvvm -vms 2 -ref 1 -timeout $RUN_LIMIT -limit $CMD_LIMIT -drop-ud 100 -- \
    @0 pingpong --rdma-core --listen 0.0.0.0 --ud --size 64 --iters 1000 --stall 5s + \
    @1 sleep 6 + @1 retry ibv_ud_pingpong -g 1 -n 1000 -s 64 192.168.100.1 2>&1)
  rc=$?
  echo "$out" > "$LOGS/lossy-pvvm.log"
  echo "$out" | grep -E '^pvvm: (stopped|vm[0-9]: (`|backend))|stalled' | cut -c1-240
  [ $rc != 0 ] || { echo "a run that lost a datagram passed"; return 1; }
  grep -q 'drop_injected=1' <<<"$out" || { echo "the post-mortem does not show the backend's drop counter"; return 1; }
  grep -q 'stalled: no completion' <<<"$out" || { echo "pvctl did not report the stall"; return 1; }
  grep -q 'pvvm: stopped: .*pingpong' <<<"$out" || { echo "the post-mortem does not name the failed command"; return 1; }
  echo "lossy: the lost datagram failed the run in $((SECONDS - t0)) s (limit $RUN_LIMIT), naming the command and the drop"
}

# UCX between two host processes over the backend (scripts/ucxhost.sh, the
# host column of scripts/amside.sh): its client must report all its
# iterations.
ucxhost_check() {
  local out
  out=$(bash scripts/ucxhost.sh ucp_am_lat 8 1000 2>&1) || { echo "$out" | tail -8; echo "UCX on the host over the backend failed"; return 1; }
  echo "$out" | grep '^Final:'
  grep -q '^Final: *1000 ' <<<"$out" || { echo "UCX on the host: the client did not report its 1000 iterations"; return 1; }
}

# The model's fabric across processes (pvsim.JoinFabric): two pvctl
# processes on one --fabric directory run a ping-pong and the one-sided
# benches (RDMA WRITE, READ, atomics: version 20). Then Open MPI's mpirun
# starts am jobs on the host, each task a pvctl process
# with its own device model, the models meeting on one fabric directory
# (pvsim.JoinFabric): 8 tasks run an all-to-all (pvctl am --launcher, the
# job's rank and size from mpirun's own variables), every byte checked and
# every task's counters exact; then a job in which task 3 is killed
# mid-transfer: each of the others must find it gone (purged, or owing
# messages past --stall), say so naming it, and end; nothing waits for
# ever (mpirun's recovery mode keeps the others running to report).
job_tier() {
  local pv=$PWD/build/pvctl-job dir out rc port=$((20000 + RANDOM % 20000)) i p mp args
  local mpi=(mpirun --allow-run-as-root --oversubscribe)
  $GO build -o "$pv" ./cmd/pvctl || return 1

  # Two pvctl processes, each its own model (v20) on one fabric directory:
  # a ping-pong with every byte checked, then the one-sided benches.
  dir=$(mktemp -d /tmp/vfrdma-job.XXXXXX)
  for args in "pingpong --rc --size 4096 --iters 300" "bench --write --messages 2000 --batches 1,32" \
              "bench --read --messages 2000 --batches 1,32" "bench --atomic --messages 1000 --batches 1,32"; do
    port=$((port + 1))
    # shellcheck disable=SC2086 # the command's words
    "$pv" --model v20 --fabric "$dir" $args --listen 127.0.0.1:$port >"$dir/srv" 2>&1 &
    p=$!
    # shellcheck disable=SC2086
    out=$(timeout 120 "$pv" --model v20 --fabric "$dir" $args --connect 127.0.0.1:$port 2>&1); rc=$?
    wait $p; i=$?
    grep -E 'round trips|every byte|^ +(1|32) ' <<<"$out"
    [ $rc = 0 ] && [ $i = 0 ] || { echo "$out"; cat "$dir/srv"; echo "pvctl $args between two processes failed ($rc, server $i)"; rm -rf "$dir"; return 1; }
  done
  rm -rf "$dir"
  dir=$(mktemp -d /tmp/vfrdma-job.XXXXXX)
  out=$(timeout 300 "${mpi[@]}" -n 8 -x VFRDMA_AM_ADDR=127.0.0.1:$port \
    "$pv" --model v20 --fabric "$dir" am --launcher --sizes 8,4096,70000 --messages 50 2>&1)
  rc=$?
  rm -rf "$dir"
  echo "$out" | grep -v ': sending$' | cut -c1-220
  [ $rc = 0 ] || { echo "the 8-task job failed (mpirun: $rc)"; return 1; }
  [ "$(grep -c 'every byte checked; counters exact' <<<"$out")" = 8 ] || { echo "not every task of the job reported exact counters"; return 1; }

  dir=$(mktemp -d /tmp/vfrdma-job.XXXXXX)
  port=$((port + 1))
  timeout 150 "${mpi[@]}" --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0 -n 8 -x VFRDMA_AM_ADDR=127.0.0.1:$port \
    "$pv" --model v20 --fabric "$dir" am --launcher --sizes 8,4096 --messages 1500 --stall 5s >"$dir/out" 2>&1 &
  mp=$!
  for i in $(seq 1 600); do [ "$(grep -c ': sending$' "$dir/out")" = 8 ] && break; sleep 0.1; done
  sleep 1
  for p in $(pgrep -f "$pv --model v20 --fabric $dir"); do
    if grep -qxz 'OMPI_COMM_WORLD_RANK=3' "/proc/$p/environ" 2>/dev/null; then kill -9 "$p" && echo "killed task 3 (pid $p) mid-transfer"; fi
  done
  wait $mp
  out=$(grep -v ': sending$' "$dir/out" | grep -v 'PMIX ERROR')
  rm -rf "$dir"
  echo "$out" | grep '^pvctl: task' | cut -c1-200
  [ "$(grep -c '^pvctl: task [0-9] of 8: .*task 3' <<<"$out")" = 7 ] || { echo "not every other task named the killed task 3"; return 1; }
  [ "$(grep -c 'with the tasks not gone, .* every byte checked' <<<"$out")" = 7 ] || { echo "not every other task finished with the living ones"; return 1; }
}

# cdev_tier boots the cdev guest (Debian's 6.12 with iommufd and the VFIO
# device cdev, built by setup): first the kernel's own proof (the cdev
# and iommufd sequence by hand, qemu/guest/testdata/cdev), then the
# driver over that path (pvvm -vfio cdev: VFRDMA_VFIO=cdev in every
# vfrdma program): the root package's and am's whole one-VM in-guest
# suites, vfio's in-guest tests (its others fake a path of their own), and
# a two-VM ping-pong whose pvctl info must say it took the cdev.
cdev_tier() {
  $GO run ./cmd/pvvm -kernel cdev -timeout $GUEST_LIMIT -test qemu/guest/testdata/cdev || return
  $GO run ./cmd/pvvm -kernel cdev -vfio cdev -timeout $GUEST_LIMIT -test .,am || return
  $GO run ./cmd/pvvm -kernel cdev -vfio cdev -timeout $GUEST_LIMIT -test vfio -run '^TestGuest' || return
  local out rc
  out=$($GO run ./cmd/pvvm -vms 2 -kernel cdev -vfio cdev -timeout $RUN_LIMIT -limit $CMD_LIMIT -- \
    info --json + pingpong --vm --rc --iters 300 --size 4096 2>&1)
  rc=$?
  echo "$out" > "$LOGS/guest-cdev-pvvm.log"
  grep -E 'RC pingpong|"vfio"|^pvvm: +vm' <<<"$out"
  [ $rc = 0 ] || { pvvm_failure "$out"; return $rc; }
  [ "$(grep -c '"vfio": "cdev"' <<<"$out")" = 2 ] || { echo "pvctl info did not say both VMs took the device cdev"; return 1; }
  [ "$(grep -c 'RC pingpong: 300 round trips' <<<"$out")" -ge 1 ] || { echo "the two-VM ping-pong over the cdev reported no round trips"; return 1; }
}

run_tier() {
  case $1 in
    vet)       $GO vet ./... && $GO vet -tags guest ./... && $GO vet -tags bench ./qemu/... &&
               $GO tool staticcheck ./... && $GO tool staticcheck -tags guest ./... && $GO tool staticcheck -tags bench ./qemu/... ;;
    host)      $GO test -race -count=1 -timeout $HOST_LIMIT ./... ;;
    backend)   make -s -C qemu/softverbs test OUT="$SV_OUT" && ucxhost_check ;;
    guest)     $GO test -tags bench -count=1 ./qemu/... && $GO run ./cmd/pvvm -timeout $GUEST_LIMIT -test all ;;
    guest-2vm) $GO run ./cmd/pvvm -vms 2 -timeout $GUEST_LIMIT -test all -run "$TWO_VM_TESTS" ;;
    guest-3vm) $GO run ./cmd/pvvm -vms 3 -timeout $GUEST_LIMIT -test am -run "$THREE_VM_TESTS" ;;
    # The cdev guest (make setup builds its kernel): /dev/iommu, the device
    # cdevs, and iommufd's bind/IOAS/attach/map on pvrdma's cdev.
    guest-cdev) cdev_tier ;;
    reference) reference_tier ;;
    interop)   interop_tier ;;
    dropin)    dropin_tier ;;
    lossy)     lossy_tier ;;
    job)       job_tier ;;
    *) echo "unknown tier $1" >&2; return 2 ;;
  esac
}

# Each tier's output goes to the terminal and to
# build/test-logs/<run>/<tier>.log, one directory per run of this script
# (build/test-logs/latest is the newest; the last 30 are kept), so a run's
# logs are never overwritten by the next; a failed tier's digest (the failing
# tests and their first error lines) is printed again at the end, where a
# log's tail is what a reader sees.
LOGS=$PWD/build/test-logs/$(date +%Y%m%d-%H%M%S)-$$
mkdir -p "$LOGS"
ln -sfn "$(basename "$LOGS")" "$PWD/build/test-logs/latest"
ls -1d "$PWD"/build/test-logs/2*/ 2>/dev/null | head -n -30 | xargs -r rm -rf

digest() {
  grep -E -- '--- FAIL|^FAIL|  FAIL \(|panic:|Error Trace:|Error:|Messages:|init error|timed out|failed|FAILED' "$1" | sed -n 1,40p
}

tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(vet host backend job guest guest-2vm guest-3vm guest-cdev reference interop dropin lossy)
passed=0 failed=0 failures=()
for t in "${tiers[@]}"; do
  echo "=== tier: $t"
  t0=$SECONDS
  run_tier "$t" 2>&1 | tee "$LOGS/$t.log"
  rc=${PIPESTATUS[0]}
  if [ $rc = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$t"); fi
  echo "=== tier: $t: $([ $rc = 0 ] && echo ok || echo "FAILED ($rc)") in $((SECONDS - t0))s"
done
for t in "${failures[@]}"; do
  echo "failed tier: $t (whole log: ${LOGS#$PWD/}/$t.log); digest:"
  digest "$LOGS/$t.log" | sed 's/^/    /'
done
echo "tiers: $passed passed, $failed failed"
[ "$failed" = 0 ]
