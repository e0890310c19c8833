#!/usr/bin/env bash
# make test: every tier, in order of cost; the summary line comes last.
# Each tier runs even if an earlier one failed, so one run shows everything.
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
SV_OUT=$PWD/build/softverbs
declare -a names results
tier() {
  local name=$1; shift
  echo "=== tier: $name"
  local t0=$SECONDS
  "$@"
  local rc=$?
  names+=("$name"); results+=("$rc")
  echo "=== tier: $name: $([ $rc = 0 ] && echo ok || echo "FAILED ($rc)") in $((SECONDS - t0))s"
}

tier vet          $GO vet ./...
tier host         $GO test -race -count=1 ./...
tier backend      make -s -C qemu/softverbs test OUT="$SV_OUT"
tier guest        $GO run ./cmd/pvvm -test all
tier guest-2vm    $GO run ./cmd/pvvm -vms 2 -test all -run '^(TestSmoke|TestMultiVM)'

passed=0 failed=0
for i in "${!names[@]}"; do
  if [ "${results[$i]}" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "failed tier: ${names[$i]}"; fi
done
echo "tiers: $passed passed, $failed failed"
[ "$failed" = 0 ]
