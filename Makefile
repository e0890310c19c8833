# vfrdma: a Go kernel-bypass driver for the VMware pvrdma NIC, and its bench.
#
#   make demo       set up, then the driver on the model and in VMs, with a report (a few minutes)
#   make bench      set up, then the comparisons with the kernel's stack and UCX, tables and
#                   charts in build/bench-results/ (about half an hour; BENCH_ARGS=--short)
#   make test       set up, then every test: host, backend, in-guest
#   make setup      Debian packages and the guest kernel (idempotent)
#   make softverbs  the software RDMA backend QEMU loads (build/softverbs)
#   make dropin     the libibverbs.so.1 drop-in over the driver (build/vfrdma)

SHELL   := /bin/bash
GO      ?= go
CC      ?= gcc
OUT     := $(CURDIR)/build
SV_OUT  := $(OUT)/softverbs
PVVM    := $(GO) run ./cmd/pvvm

DROPIN  := $(OUT)/vfrdma/libibverbs.so.1

.PHONY: all setup softverbs dropin test test-host test-backend test-guest demo bench clean

all: softverbs
	$(GO) build ./...

setup:
	@bash scripts/setup.sh

softverbs:
	@$(MAKE) -s -C qemu/softverbs OUT=$(SV_OUT)

# The drop-in: cgo's c-shared library with the ABI's symbol map and soname
# (ibverbs/doc.go), and beside it verbsabi's librdmacm stand-in (the
# system's librdmacm, which perftest links, needs libibverbs symbols no
# drop-in exports). Go decides whether the library is up to date.
dropin:
	@mkdir -p $(dir $(DROPIN))
	$(GO) build -buildmode=c-shared -ldflags '-extldflags "-Wl,--version-script=$(CURDIR)/verbsabi/libibverbs.map -Wl,-soname,libibverbs.so.1 -Wl,-z,now"' -o $(DROPIN) ./ibverbs
	@rm -f $(basename $(DROPIN)).h $(DROPIN:.1=.h)
	$(CC) -O2 -Wall -Wextra -fPIC -shared -fvisibility=hidden -std=gnu11 -Wl,-soname,librdmacm.so.1 \
		-Wl,--version-script=$(CURDIR)/verbsabi/librdmacm.map -o $(dir $(DROPIN))librdmacm.so.1 verbsabi/rdmacm.c

test: setup softverbs
	@bash scripts/test.sh

# The tiers of `make test`, one at a time.
test-host:
	@bash scripts/test.sh vet host

test-backend: softverbs
	@bash scripts/test.sh backend

test-guest: softverbs
	@bash scripts/test.sh guest guest-2vm

demo: setup softverbs
	@bash scripts/demo.sh

# BENCH_ARGS: scripts/bench.sh's arguments (-r ROUNDS, --short, which ones).
bench: setup softverbs
	@bash scripts/bench.sh $(BENCH_ARGS)

clean:
	rm -rf $(OUT)
