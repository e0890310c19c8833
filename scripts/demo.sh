#!/usr/bin/env bash
# make demo: the driver on the device model, then in VMs, with a readable
# report; a few minutes after setup. The comparisons with the kernel's
# stack and with UCX are make bench's (scripts/bench.sh), not the demo's.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

section() { printf '\n=== %s\n\n' "$*"; }

section "The device model at interface version 20 (VMware's device, QP handles): no root, no VM"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
$GO build -o "$bin/pvctl" ./cmd/pvctl
info=$("$bin/pvctl" --model v20 info)
grep -E '^(hca_id|interface version|port 1 state|port 1 GID\[0\]|quirks):' <<<"$info"
echo
"$bin/pvctl" --model v20 pingpong --write --iters 1000 --size 4096
echo
"$bin/pvctl" --model v20 bench --atomic --messages 5000 --batches 1,32

section "One VM: the NIC taken through VFIO, then traffic between two QPs of it"
$GO run ./cmd/pvvm -- \
  list + info + \
  pingpong --rc --iters 1000 --size 4096 + \
  pingpong --ud --iters 1000 --size 2048 + \
  pingpong --srq 4 --iters 500 --size 4096 + \
  bench --rc --messages 10000 + \
  bench --rc --messages 5000 --batches 1,32 --spin + \
  bench --rc --messages 5000 --batches 1,32 --wait + \
  eth info + \
  eth ping --count 5 --size 1000 10.0.2.2 + \
  eth gen --sizes 64,1514 --batches 1,32 --frames 5000

section "Two VMs on one fabric: traffic between the VMs"
$GO run ./cmd/pvvm -vms 2 -- \
  pingpong --vm --rc --iters 500 --size 4096 + \
  pingpong --vm --tag srq --srq 4 --iters 300 --size 4096 + \
  bench --vm --tag spin --rc --messages 5000 --batches 1,32 --spin + \
  bench --vm --tag wait --rc --messages 5000 --batches 1,32 --wait + \
  am --vm --iters 300 --messages 5000 + \
  eth gen --vm --sizes 64,1514 --batches 1,32 --frames 5000

cat <<'TXT'

What you saw: first pvctl on the device model (package pvsim) playing
VMware's device at interface version 20, in this process: a ping-pong of
RDMA WRITEs WITH IMMEDIATE into the other QP's buffer, every byte checked,
and a one-sided bench of fetch-and-adds on one 8-byte word, each value
fetched checked and the word's final value equal to the number of adds
(QEMU's device runs none of these). Then pvctl ran inside QEMU guests whose pvrdma NIC the driver took
from the kernel through VFIO and the emulated IOMMU. Every ping-pong byte was
checked; the bench counts doorbells per message (each one is a VM exit; a
batch posted as one chain rings once). Plain, one loop polls both ends;
with --spin the receiver polls its CQ in a loop of its own; with --wait it
sleeps on a wait set (an eventfd the CQ interrupt signals) whenever its CQ
is empty: compare the CPU time per message. `pvctl am` sends active
messages (LAPI_Amsend semantics) between the VMs: latency, the message rate
beside raw PostSend's, and bandwidth. `pvctl eth` drives the slot's
vmxnet3 Ethernet function, which the driver brings up beside the RDMA one
(that is what makes the RDMA port ACTIVE in `info`): it pings QEMU's user
network through ARP and ICMP, and sends frames to the other VM over the
bench's switch. `make test` runs every test.

The comparisons are make bench's: `make bench` (about 25 min on two cores)
runs Linux's own stack for this NIC (vmw_pvrdma + rdma-core, perftest) and
UCX's active messages beside vfrdma on the same emulated device, and writes
their tables and charts to build/bench-results/; the latest recorded ones,
with their charts, open docs/benchmarks.md.
TXT
