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

# The tiers of `make test`, one at a time.
test-host:
	@bash scripts/test.sh vet host

test-backend: softverbs
	@bash scripts/test.sh backend

test-guest: softverbs
	@bash scripts/test.sh guest guest-2vm

demo: setup softverbs
	@bash scripts/demo.sh

clean:
	rm -rf $(OUT)
