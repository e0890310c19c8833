#!/usr/bin/env bash
# make setup: everything the bench needs on a fresh Debian 12 machine.
# Idempotent: installs only missing packages, fetches the guest kernel only
# when the cache does not already hold the version Debian currently points at.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
cache="$top/.cache/kernel"

# Packages the bench, the backend and the conformance runs use.
pkgs=(
  qemu-system-x86    # 7.2 with -device pvrdma
  ipxe-qemu          # option ROMs QEMU looks for at start
  libibverbs-dev     # verbs headers the software backend and the drop-in (make dropin) implement
  libibumad-dev      # MAD header layout for the mux
  ibverbs-utils      # rdma-core's pingpong programs: conformance clients
  ibverbs-providers  # rdma-core's providers, vmw_pvrdma among them (the reference guest)
  perftest           # ib_send_bw / ib_send_lat (the reference guest, the backend's ceiling)
  ucx-utils libucx0  # ucx_perftest: UCX's active messages in the reference guest (scripts/amside.sh)
  xz-utils           # the guest kernel is unpacked once for a faster boot
  zstd               # the same for the cdev guest's kernel (6.12 is zstd-compressed)
  gdb                # a stopped VM's post-mortem shows its QEMU threads' stacks
  openmpi-bin        # mpirun: make test's job tier starts am jobs with it
  gcc make
)

die() { echo "setup: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (apt-get, VFIO and QEMU need it); run: sudo make setup"
# Go: at least the version go.mod names; Debian 12's own is too old.
# shellcheck source=gocheck.sh
source "$top/scripts/gocheck.sh"
check_go "$top" || exit 1

# install_missing WHY PKG...: installs those of the packages that are not.
install_missing() {
  local why=$1; shift
  local missing=() p
  for p in "$@"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = 'install ok installed' ] || missing+=("$p")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  echo "setup: installing ${missing[*]}$why"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
}
install_missing "" "${pkgs[@]}"

# The guest kernel: whatever linux-image-amd64 currently depends on (Debian
# bumps the ABI number, so the name is resolved, not written down).
if [ -z "${VFRDMA_KERNEL_PKG:-}" ]; then
  if ! VFRDMA_KERNEL_PKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ && !n++ {print $2}') || [ -z "$VFRDMA_KERNEL_PKG" ]; then
    apt-get update -qq || true
    VFRDMA_KERNEL_PKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ && !n++ {print $2}')
  fi
fi
[ -n "$VFRDMA_KERNEL_PKG" ] || die "cannot resolve the kernel package behind linux-image-amd64 (apt-get update?)"

ver=${VFRDMA_KERNEL_PKG#linux-image-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
kernel_deb() { # the kernel package, unpacked once per run into $tmp/root
  [ -d "$tmp/root" ] && return 0
  (cd "$tmp" && apt-get download -qq "$VFRDMA_KERNEL_PKG" >/dev/null) || die "apt-get download $VFRDMA_KERNEL_PKG failed"
  dpkg -x "$tmp"/*.deb "$tmp/root"
}
copy_modules() { # copy_modules DIR NAME...: the named modules of the kernel package into DIR
  local dir=$1; shift
  mkdir -p "$dir"
  for m in "$@"; do
    f=$(find "$tmp/root/lib/modules/$ver" -name "$m.ko*" -print -quit)
    [ -n "$f" ] || die "module $m not found in $VFRDMA_KERNEL_PKG"
    cp "$f" "$dir/"
  done
}

if ! { [ -f "$cache/PACKAGE" ] && [ "$(cat "$cache/PACKAGE")" = "$VFRDMA_KERNEL_PKG" ] && [ -f "$cache/vmlinuz" ]; }; then
  echo "setup: fetching guest kernel $VFRDMA_KERNEL_PKG"
  kernel_deb
  rm -rf "$cache"
  mkdir -p "$cache"
  cp "$tmp/root/boot/vmlinuz-$ver" "$cache/vmlinuz"
  cp "$tmp/root/boot/config-$ver" "$cache/config"
  # Only the modules the guest loads are kept; the rest of the tree is large.
  copy_modules "$cache/modules" irqbypass vfio vfio_iommu_type1 vfio_virqfd vfio-pci-core vfio-pci
  echo "$ver" > "$cache/VERSION"
  echo "$VFRDMA_KERNEL_PKG" > "$cache/PACKAGE"
  echo "setup: guest kernel $ver in .cache/kernel"
fi

# The reference stack's kernel side: Debian's kernel does not build
# vmw_pvrdma (CONFIG_INFINIBAND_VMWARE_PVRDMA is not set), so it is built
# out of tree from Debian's kernel source (only that driver's folder) against
# the guest kernel's headers, beside the modules it needs from the kernel
# package. Rebuilt only when the kernel changes.
ref="$cache/ref-modules"
if ! { [ -f "$ref/VERSION" ] && [ "$(cat "$ref/VERSION")" = "$ver" ] && [ -f "$ref/vmw_pvrdma.ko" ]; }; then
  series=$(echo "$ver" | cut -d. -f1,2)     # 6.1.0-56-amd64 -> 6.1
  install_missing " (to build vmw_pvrdma for the reference guest)" "linux-headers-$ver" "linux-source-$series"
  echo "setup: building vmw_pvrdma.ko for $ver"
  kernel_deb
  rm -rf "$ref"
  copy_modules "$ref" ib_core ib_uverbs vmxnet3 failover net_failover virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_net
  tar -xJf "/usr/src/linux-source-$series.tar.xz" -C "$tmp" --wildcards "linux-source-$series/drivers/infiniband/hw/vmw_pvrdma/*" \
    || die "vmw_pvrdma's sources not found in /usr/src/linux-source-$series.tar.xz"
  src="$tmp/linux-source-$series/drivers/infiniband/hw/vmw_pvrdma"
  make -s -C "/usr/src/linux-headers-$ver" M="$src" CONFIG_INFINIBAND_VMWARE_PVRDMA=m modules >"$tmp/kbuild.log" 2>&1 \
    || { tail -20 "$tmp/kbuild.log" >&2; die "building vmw_pvrdma.ko failed (log above)"; }
  strip --strip-debug -o "$ref/vmw_pvrdma.ko" "$src/vmw_pvrdma.ko"
  echo "$ver" > "$ref/VERSION"
  echo "setup: vmw_pvrdma.ko and the reference guest's modules in .cache/kernel/ref-modules"
fi


# The cdev guest's kernel (iommufd and the VFIO device cdev): see the script.
# shellcheck source=cdevkernel.sh
source "$top/scripts/cdevkernel.sh"
