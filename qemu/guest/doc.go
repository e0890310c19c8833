// Package guest builds the test bench's guest image on the host: it finds
// the guest kernel that `make setup` unpacked, builds the static programs
// that run in the guest (the init from qemu/guestinit, `go test -c` binaries
// with the guest build tag, commands), and packs them into an initramfs
// (an uncompressed newc cpio archive, written with u-root's cpio package)
// together with the kernel modules and a Manifest that tells the init what
// to do.
//
// The image holds /init, the modules under ModulesDir, the programs under
// BinDir (by Program.Name) and the manifest at proto.ManifestPath. The init
// loads the modules in order, binds the pvrdma function's IOMMU group to
// vfio-pci if Spec.BindPVRDMA is set, then runs the programs one after the
// other and reports on the console in proto records; see qemu/guestinit.
//
// The package also holds what the init shares with the host: the Manifest
// type and TestParser, which turns a test binary's -test.v output into test
// results.
//
// Two guest kernels: FindKernel reads the stock one's cache (KernelDir,
// in the checkout), FindNamedKernel either it or the cdev kernel's
// (CdevKernelDir, outside the checkout: Debian's 6.12 with iommufd and the
// VFIO device cdev built by `make setup`). Both caches have the same
// layout: vmlinuz, VERSION, config, modules/ and ref-modules/.
//
// Booting: give QEMU Kernel.Image() as -kernel (after ExtractVmlinux, the
// uncompressed kernel, which boots about 4 s faster under TCG), the image
// as -initrd, "console=ttyS0" plus proto.CmdlineVM and proto.CmdlineVMs on
// the command line, and two serial ports: the console (-serial stdio) and
// the control channel (-serial chardev:...), which the guest sees as
// proto.ControlDevice.
//
// Nothing here prints or keeps global state; the functions may be called
// from several goroutines, each on its own outputs. The build helpers run
// the go command found on PATH.
package guest
