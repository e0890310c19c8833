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
  libibverbs-dev     # verbs headers the software backend implements
  libibumad-dev      # MAD header layout for the mux
  ibverbs-utils      # rdma-core's pingpong programs: conformance clients
  xz-utils           # the guest kernel is unpacked once for a faster boot
  gcc make
)

die() { echo "setup: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (apt-get, VFIO and QEMU need it); run: sudo make setup"
command -v go >/dev/null || die "go is not on PATH: install Go 1.26 or newer (go.mod needs it)"

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
fi

# The guest kernel: whatever linux-image-amd64 currently depends on (Debian
# bumps the ABI number, so the name is resolved, not written down).
if [ -z "${VFRDMA_KERNEL_PKG:-}" ]; then
  if ! VFRDMA_KERNEL_PKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}') || [ -z "$VFRDMA_KERNEL_PKG" ]; then
    apt-get update -qq || true
    VFRDMA_KERNEL_PKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  fi
fi
[ -n "$VFRDMA_KERNEL_PKG" ] || die "cannot resolve the kernel package behind linux-image-amd64 (apt-get update?)"

if [ -f "$cache/PACKAGE" ] && [ "$(cat "$cache/PACKAGE")" = "$VFRDMA_KERNEL_PKG" ] && [ -f "$cache/vmlinuz" ]; then
  exit 0
fi
echo "setup: fetching guest kernel $VFRDMA_KERNEL_PKG"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"; (cd "$tmp" && apt-get download -qq "$VFRDMA_KERNEL_PKG" >/dev/null) || die "apt-get download $VFRDMA_KERNEL_PKG failed"
dpkg -x "$tmp"/*.deb "$tmp/root"
ver=${VFRDMA_KERNEL_PKG#linux-image-}
rm -rf "$cache"
mkdir -p "$cache"
cp "$tmp/root/boot/vmlinuz-$ver" "$cache/vmlinuz"
cp "$tmp/root/boot/config-$ver" "$cache/config"
# Only the modules the guest loads are kept; the rest of the tree is large.
mkdir -p "$cache/modules"
for m in irqbypass vfio vfio_iommu_type1 vfio_virqfd vfio-pci-core vfio-pci; do
  f=$(find "$tmp/root/lib/modules/$ver" -name "$m.ko*" | head -1)
  [ -n "$f" ] || die "module $m not found in $VFRDMA_KERNEL_PKG"
  cp "$f" "$cache/modules/"
done
echo "$ver" > "$cache/VERSION"
echo "$VFRDMA_KERNEL_PKG" > "$cache/PACKAGE"
echo "setup: guest kernel $ver in .cache/kernel"
