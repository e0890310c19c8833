// Package uapi is the one gateway from this module to the kernel's VFIO
// interface (include/uapi/linux/vfio.h) and to iommufd
// (include/uapi/linux/iommufd.h), which the VFIO device cdev path maps DMA
// through: the ABI structs with fixed-width
// fields and explicit padding, the ioctl request numbers, the capability
// chain parser, and thin wrappers that issue each ioctl. No other package
// issues VFIO or iommufd ioctls.
//
// Every ioctl goes through a Kernel. Linux is the real one; tests of the
// layers above substitute a fake that answers the same requests on the same
// byte layouts, which is why arguments travel as byte slices: structs are
// encoded in native byte order with encoding/binary (control path only; none
// of this is on a data path), and the golden tests pin that the encoded
// layout equals the C layout (sizes, offsets, request numbers, computed once
// from the C headers and hard-coded).
package uapi
