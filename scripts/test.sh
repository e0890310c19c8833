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

run_tier() {
  case $1 in
    vet)       $GO vet ./... && $GO vet -tags guest ./... && $GO tool staticcheck ./... && $GO tool staticcheck -tags guest ./... ;;
    host)      $GO test -race -count=1 ./... ;;
    backend)   make -s -C qemu/softverbs test OUT="$SV_OUT" ;;
    guest)     $GO run ./cmd/pvvm -test all ;;
    guest-2vm) $GO run ./cmd/pvvm -vms 2 -test all -run "$TWO_VM_TESTS" ;;
    guest-3vm) $GO run ./cmd/pvvm -vms 3 -test am -run "$THREE_VM_TESTS" ;;
    *) echo "unknown tier $1" >&2; return 2 ;;
  esac
}

tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(vet host backend guest guest-2vm guest-3vm)
passed=0 failed=0 failures=()
for t in "${tiers[@]}"; do
  echo "=== tier: $t"
  t0=$SECONDS
  run_tier "$t"
  rc=$?
  if [ $rc = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$t"); fi
  echo "=== tier: $t: $([ $rc = 0 ] && echo ok || echo "FAILED ($rc)") in $((SECONDS - t0))s"
done
for t in "${failures[@]}"; do echo "failed tier: $t"; done
echo "tiers: $passed passed, $failed failed"
[ "$failed" = 0 ]
