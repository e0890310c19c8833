#!/usr/bin/env bash
# Mutation testing: plants faults in the named Go files one at a time, runs
# the tests that should catch each one and reports the survivors. File names
# are relative to the repository root; the flags are in
# internal/tools/mutate/main.go.
#   scripts/mutate.sh am/send.go
#   scripts/mutate.sh -j 2 -n 20 -seed 7 am/send.go
#   scripts/mutate.sh -only am/send.go:88
#   scripts/mutate.sh -faults docs/faults-sample.txt   (hand-written faults)
# It never writes the work tree: each mutant is compiled from a temporary
# copy through go test -overlay.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./internal/tools/mutate "$@"
