# Sourced by setup.sh (which defines die, install_missing and tmp): the
# cdev guest's kernel.
#
# The cdev guest: a second guest kernel whose VFIO offers the device cdev
# (/dev/vfio/devices/vfioN) and iommufd (/dev/iommu), for the driver's cdev
# path. Every Debian kernel ships with CONFIG_IOMMUFD off, so this is
# Debian's 6.12 kernel (bookworm-security's linux-image-6.12-amd64) with
# iommufd and its VFIO modules (vfio with CONFIG_VFIO_DEVICE_CDEV and
# CONFIG_IOMMUFD, vfio_iommu_type1, vfio-pci-core, vfio-pci: the cdev adds
# fields to struct vfio_device, so all of them) built out of tree from
# Debian's linux-source-6.12, loaded in place of the kernel package's. The
# core kernel exports all they need but the span iterator of lib/interval_tree.c
# and lib/iova_bitmap (CONFIG_INTERVAL_TREE_SPAN_ITER and
# CONFIG_IOMMUFD_DRIVER are off), which are built into iommufd.ko. The group
# path stays (CONFIG_VFIO_GROUP and CONFIG_VFIO_CONTAINER).
#
# The result is cached outside the checkout, in $VFRDMA_CACHE
# (/var/cache/vfrdma by default)/kernel-cdev, so a fresh clone on the same
# machine reuses it; it is rebuilt only when Debian's package version
# changes. The first build (downloading the kernel package, its headers and
# its source, 276 MB, then the modules; at most 450 MB in $TMPDIR) took 141
# to 195 s on the bench's 2-core machine at load 4 to 7; a setup that finds
# the cache only asks apt for the version.
cdev_dir=${VFRDMA_CACHE:-/var/cache/vfrdma}/kernel-cdev
cdev_series=${VFRDMA_CDEV_SERIES:-6.12}
# cdev_resolve: the package (cdev_pkg) and version (cdev_version) the
# meta-package points at, which pins both ("Depends: linux-image-X (= V)"):
# one apt-cache call, about 2 s here, so a setup that finds the cache is fast.
cdev_resolve() {
  read -r cdev_pkg cdev_version < <(apt-cache show --no-all-versions "linux-image-$cdev_series-amd64" 2>/dev/null |
    awk '/^Depends: linux-image-[0-9]/ && $3 == "(=" && !n++ { v = $4; sub(/[),].*$/, "", v); print $2, v }') || true
  [ -n "$cdev_pkg" ] && [ -n "$cdev_version" ]
}
if ! cdev_resolve; then
  apt-get update -qq || true
  cdev_resolve || die "cannot resolve the kernel package behind linux-image-$cdev_series-amd64 (bookworm-security; apt-get update?)"
fi
cdev_key="$cdev_pkg $cdev_version"

# cdev_modules SRC DIR NAME...: the named modules of the unpacked kernel
# package at SRC, uncompressed (so their dependencies can be read), into
# DIR; a module the kernel has built in is skipped.
cdev_modules() {
  local src=$1 dir=$2 m f; shift 2
  mkdir -p "$dir"
  for m in "$@"; do
    f=$(find "$src" -name "$m.ko*" -print -quit)
    if [ -z "$f" ]; then
      grep -q "/$m.ko\$" "$src/modules.builtin" || die "module $m not found in $cdev_pkg"
      continue
    fi
    case $f in
      *.ko.xz) xz -dc "$f" > "$dir/$m.ko" ;;
      *.ko) cp "$f" "$dir/$m.ko" ;;
      *) die "module $f: unknown compression" ;;
    esac
  done
}

# cdev_kbuild DIR LOG ARGS...: builds the out-of-tree modules in DIR
# against the cdev kernel's headers; modpost must find every symbol.
cdev_kbuild() {
  local dir=$1 log=$2; shift 2
  nice -n 10 make -C "$kh" M="$dir" -j"$(nproc)" "$@" modules >"$log" 2>&1 \
    || { tail -30 "$log" >&2; die "building the modules in $dir failed (log above)"; }
  if grep -E 'undefined!|^ERROR' "$log" >&2; then
    die "modpost: the modules in $dir need symbols the cdev kernel $cdev_ver does not export (above)"
  fi
}

if ! { [ "$(cat "$cdev_dir/PACKAGE" 2>/dev/null)" = "$cdev_key" ] && [ -f "$cdev_dir/vmlinuz" ]; }; then
  t0=$SECONDS
  cdev_ver=${cdev_pkg#linux-image-}
  echo "setup: building the cdev guest kernel: $cdev_pkg $cdev_version with iommufd and the VFIO device cdev, into $cdev_dir"
  # The kernel package, its headers (of this very version: the modules'
  # symbol CRCs) and the source of the same version are downloaded and
  # unpacked, not installed: installing the headers would pull the kernel
  # image onto the host, and its initramfs tools.
  install_missing " (to build the cdev guest's modules)" gcc-12 pahole libelf1
  w="$tmp/cdev"
  mkdir -p "$w"
  debs=("$cdev_pkg" "linux-headers-$cdev_ver" "linux-headers-${cdev_ver%-amd64}-common" "linux-kbuild-${cdev_ver%-amd64}" "linux-source-$cdev_series")
  (cd "$w" && apt-get download -qq "${debs[@]/%/=$cdev_version}" >/dev/null 2>"$w/download.log") \
    || { cat "$w/download.log" >&2; die "apt-get download ${debs[*]} ($cdev_version) failed"; }
  for f in "$w"/*.deb; do dpkg -x "$f" "$w/root" || die "dpkg -x $f failed"; rm "$f"; done
  kh="$w/root/usr/src/linux-headers-$cdev_ver"
  sed -i "s|^include /usr/src/|include $w/root/usr/src/|" "$kh/Makefile"
  s="linux-source-$cdev_series"
  tar -xJf "$w/root/usr/src/$s.tar.xz" -C "$w" --wildcards "$s/drivers/vfio/*" "$s/drivers/iommu/iommufd/*" "$s/drivers/iommu/iommu-priv.h" \
    "$s/lib/interval_tree.c" "$s/drivers/infiniband/hw/vmw_pvrdma/*" || die "the VFIO and iommufd sources not found in $s.tar.xz"
  s="$w/$s"
  # iommufd.ko: the kernel's own Makefile's objects, and the two library
  # parts the core kernel lacks (see above).
  b="$w/build"
  mkdir -p "$b/iommufd" "$b/vfio/pci"
  cp "$s/drivers/iommu/iommu-priv.h" "$b/"
  cp "$s"/drivers/iommu/iommufd/*.[ch] "$b/iommufd/"
  { sed -n '1,/^#include <linux\/export.h>/p' "$s/lib/interval_tree.c"
    sed -n '/^#ifdef CONFIG_INTERVAL_TREE_SPAN_ITER/,/^#endif/p' "$s/lib/interval_tree.c"
  } > "$b/iommufd/interval_tree_span.c"
  grep -q 'interval_tree_span_iter_first' "$b/iommufd/interval_tree_span.c" || die "no span iterator in $s/lib/interval_tree.c"
  # The configuration the modules are built for: CONFIG_* of the kernel's
  # headers (autoconf.h) plus these, as the preprocessor sees them.
  flags='ccflags-y += -DCONFIG_IOMMUFD_MODULE=1 -DCONFIG_IOMMUFD_DRIVER=1 -DCONFIG_VFIO_DEVICE_CDEV=1 -DCONFIG_INTERVAL_TREE_SPAN_ITER=1'
  printf '%s\nobj-m += iommufd.o\niommufd-y := device.o fault.o hw_pagetable.o io_pagetable.o ioas.o main.o pages.o vfio_compat.o iova_bitmap.o interval_tree_span.o\n' "$flags" > "$b/iommufd/Kbuild"
  cp "$s"/drivers/vfio/*.[ch] "$b/vfio/"
  cp "$s"/drivers/vfio/pci/*.[ch] "$b/vfio/pci/"
  printf '%s\nobj-m += vfio.o vfio_iommu_type1.o pci/\nvfio-y := vfio_main.o device_cdev.o group.o iommufd.o container.o virqfd.o\n' "$flags" > "$b/vfio/Kbuild"
  printf '%s\nobj-m += vfio-pci-core.o vfio-pci.o\nvfio-pci-core-y := vfio_pci_core.o vfio_pci_intrs.o vfio_pci_rdwr.o vfio_pci_config.o\nvfio-pci-y := vfio_pci.o vfio_pci_igd.o\n' "$flags" > "$b/vfio/pci/Kbuild"
  cdev_kbuild "$b/iommufd" "$w/iommufd.log"
  cdev_kbuild "$b/vfio" "$w/vfio.log" KBUILD_EXTRA_SYMBOLS="$b/iommufd/Module.symvers"
  cdev_kbuild "$s/drivers/infiniband/hw/vmw_pvrdma" "$w/pvrdma.log" CONFIG_INFINIBAND_VMWARE_PVRDMA=m

  stage="$cdev_dir.new"
  rm -rf "$stage"
  mkdir -p "$stage/modules"
  mods="$w/root/lib/modules/$cdev_ver"
  cp "$w/root/boot/vmlinuz-$cdev_ver" "$stage/vmlinuz"
  cp "$w/root/boot/config-$cdev_ver" "$stage/config"
  cdev_modules "$mods" "$stage/modules" irqbypass
  for f in "$b/iommufd/iommufd.ko" "$b/vfio/vfio.ko" "$b/vfio/vfio_iommu_type1.ko" "$b/vfio/pci/vfio-pci-core.ko" "$b/vfio/pci/vfio-pci.ko"; do
    strip --strip-debug -o "$stage/modules/$(basename "$f")" "$f"
  done
  # The reference guest's and the management network's modules, as for the
  # stock kernel (virtio and virtio_pci are built into 6.12).
  cdev_modules "$mods" "$stage/ref-modules" ib_core ib_uverbs vmxnet3 failover net_failover virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_net
  strip --strip-debug -o "$stage/ref-modules/vmw_pvrdma.ko" "$s/drivers/infiniband/hw/vmw_pvrdma/vmw_pvrdma.ko"
  echo "$cdev_ver" > "$stage/VERSION"
  echo "$cdev_key" > "$stage/PACKAGE"
  rm -rf "$cdev_dir"
  mv "$stage" "$cdev_dir"
  rm -rf "$w"
  echo "setup: the cdev guest kernel $cdev_ver in $cdev_dir ($((SECONDS - t0)) s)"
fi
