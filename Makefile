# vfrdma: a Go kernel-bypass driver for the VMware pvrdma NIC, and its bench.
#
#   make demo       set up, then boot the driver in a VM and show a report
#   make test       set up, then every test: host, backend, in-guest
#   make setup      Debian packages and the guest kernel (idempotent)
#   make softverbs  the software RDMA backend QEMU loads (build/softverbs)

SHELL   := /bin/bash
GO      ?= go
OUT     := $(CURDIR)/build
SV_OUT  := $(OUT)/softverbs
PVVM    := $(GO) run ./cmd/pvvm

.PHONY: all setup softverbs test test-host test-backend test-guest demo clean

all: softverbs
	$(GO) build ./...

setup:
	@bash scripts/setup.sh

softverbs:
	@$(MAKE) -s -C qemu/softverbs OUT=$(SV_OUT)

test: setup softverbs
	@bash scripts/test.sh

# The pieces of `make test`, for working on one tier.
test-host:
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

test-backend: softverbs
	@$(MAKE) -s -C qemu/softverbs test OUT=$(SV_OUT)

test-guest: softverbs
	$(PVVM) -test all
	$(PVVM) -vms 2 -test all -run '^(TestSmoke|TestMultiVM)'

demo: setup softverbs
	@$(PVVM) -- list + regs

clean:
	rm -rf $(OUT)
