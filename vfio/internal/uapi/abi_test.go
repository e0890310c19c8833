package uapi

import (
	"encoding/binary"
	"reflect"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

// The golden values below were produced once by a C program compiled against
// Linux's include/uapi/linux/vfio.h (x86-64, GCC): sizeof, offsetof and the
// request macros. They pin the Go layouts to the kernel's.

func TestIoctlNumbers(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" && runtime.GOARCH != "386" && runtime.GOARCH != "riscv64" && runtime.GOARCH != "s390x" && runtime.GOARCH != "loong64" && runtime.GOARCH != "arm" {
		t.Skipf("golden ioctl numbers are for asm-generic ioctl encodings, not %s", runtime.GOARCH)
	}
	golden := []struct {
		name string
		got  uint
		want uint
	}{
		{"VFIO_GET_API_VERSION", IoctlGetAPIVersion, 0x3b64},
		{"VFIO_CHECK_EXTENSION", IoctlCheckExtension, 0x3b65},
		{"VFIO_SET_IOMMU", IoctlSetIOMMU, 0x3b66},
		{"VFIO_GROUP_GET_STATUS", IoctlGroupGetStatus, 0x3b67},
		{"VFIO_GROUP_SET_CONTAINER", IoctlGroupSetContainer, 0x3b68},
		{"VFIO_GROUP_UNSET_CONTAINER", IoctlGroupUnsetContainer, 0x3b69},
		{"VFIO_GROUP_GET_DEVICE_FD", IoctlGroupGetDeviceFD, 0x3b6a},
		{"VFIO_DEVICE_GET_INFO", IoctlDeviceGetInfo, 0x3b6b},
		{"VFIO_DEVICE_GET_REGION_INFO", IoctlDeviceGetRegionInfo, 0x3b6c},
		{"VFIO_DEVICE_GET_IRQ_INFO", IoctlDeviceGetIRQInfo, 0x3b6d},
		{"VFIO_DEVICE_SET_IRQS", IoctlDeviceSetIRQs, 0x3b6e},
		{"VFIO_DEVICE_RESET", IoctlDeviceReset, 0x3b6f},
		{"VFIO_IOMMU_GET_INFO", IoctlIOMMUGetInfo, 0x3b70},
		{"VFIO_IOMMU_MAP_DMA", IoctlIOMMUMapDMA, 0x3b71},
		{"VFIO_IOMMU_UNMAP_DMA", IoctlIOMMUUnmapDMA, 0x3b72},
	}
	for _, g := range golden {
		if g.got != g.want {
			t.Errorf("%s = %#x, want %#x", g.name, g.got, g.want)
		}
	}
}

type layout struct {
	v       any
	size    uintptr
	offsets map[string]uintptr
}

func TestLayouts(t *testing.T) {
	golden := []layout{
		{InfoCapHeader{}, 8, map[string]uintptr{"ID": 0, "Version": 2, "Next": 4}},
		{GroupStatus{}, 8, map[string]uintptr{"Argsz": 0, "Flags": 4}},
		{DeviceInfo{}, 20, map[string]uintptr{"Argsz": 0, "Flags": 4, "NumRegions": 8, "NumIRQs": 12, "CapOffset": 16}},
		{RegionInfo{}, 32, map[string]uintptr{"Argsz": 0, "Flags": 4, "Index": 8, "CapOffset": 12, "Size": 16, "Offset": 24}},
		{RegionSparseMmapArea{}, 16, map[string]uintptr{"Offset": 0, "Size": 8}},
		{RegionInfoCapSparseMmap{}, 16, map[string]uintptr{"Header": 0, "NrAreas": 8, "Reserved": 12}},
		{RegionInfoCapType{}, 16, map[string]uintptr{"Header": 0, "Type": 8, "Subtype": 12}},
		{IRQInfo{}, 16, map[string]uintptr{"Argsz": 0, "Flags": 4, "Index": 8, "Count": 12}},
		{IRQSet{}, 20, map[string]uintptr{"Argsz": 0, "Flags": 4, "Index": 8, "Start": 12, "Count": 16}},
		{IOMMUType1Info{}, 24, map[string]uintptr{"Argsz": 0, "Flags": 4, "IOVAPgsizes": 8, "CapOffset": 16}},
		{IOVARange{}, 16, map[string]uintptr{"Start": 0, "End": 8}},
		{IOMMUType1InfoCapIOVARange{}, 16, map[string]uintptr{"Header": 0, "NrIOVAs": 8, "Reserved": 12}},
		{IOMMUType1InfoCapMigration{}, 32, map[string]uintptr{"Header": 0, "Flags": 8, "PgsizeBitmap": 16, "MaxDirtyBitmapSize": 24}},
		{IOMMUType1InfoDMAAvail{}, 12, map[string]uintptr{"Header": 0, "Avail": 8}},
		{DMAMap{}, 32, map[string]uintptr{"Argsz": 0, "Flags": 4, "Vaddr": 8, "IOVA": 16, "Size": 24}},
		{DMAUnmap{}, 24, map[string]uintptr{"Argsz": 0, "Flags": 4, "IOVA": 8, "Size": 16}},
	}
	checkLayouts(t, golden)
}

func checkLayouts(t *testing.T, golden []layout) {
	t.Helper()
	for _, g := range golden {
		rt := reflect.TypeOf(g.v)
		if rt.Size() != g.size {
			t.Errorf("sizeof %s = %d, want %d", rt.Name(), rt.Size(), g.size)
		}
		// The encoded form (what crosses the Kernel interface) must be the
		// in-memory form: no implicit padding anywhere.
		if n := binary.Size(g.v); uintptr(n) != g.size {
			t.Errorf("binary.Size(%s) = %d, want %d (implicit padding?)", rt.Name(), n, g.size)
		}
		named := 0
		for i := range rt.NumField() {
			f := rt.Field(i)
			if f.Name == "_" {
				continue
			}
			named++
			want, ok := g.offsets[f.Name]
			if !ok {
				t.Errorf("%s.%s has no golden offset", rt.Name(), f.Name)
				continue
			}
			if f.Offset != want {
				t.Errorf("offsetof %s.%s = %d, want %d", rt.Name(), f.Name, f.Offset, want)
			}
		}
		if named != len(g.offsets) {
			t.Errorf("%s has %d named fields, golden has %d", rt.Name(), named, len(g.offsets))
		}
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	in := RegionInfo{Argsz: 32, Flags: 7, Index: 1, CapOffset: 0, Size: 256, Offset: 1 << 40}
	b := Encode(&in)
	if len(b) != 32 || binary.NativeEndian.Uint64(b[24:]) != 1<<40 || binary.NativeEndian.Uint32(b[8:]) != 1 {
		t.Fatalf("encoded % x", b)
	}
	var out RegionInfo
	if err := Decode(b, &out); err != nil || out != in {
		t.Fatalf("decoded %+v, %v", out, err)
	}
	m := Encode(&IOMMUType1InfoCapMigration{Flags: 1, PgsizeBitmap: 2})
	if len(m) != 32 || binary.NativeEndian.Uint64(m[16:]) != 2 {
		t.Fatalf("migration cap encoded % x", m)
	}
}

// The iommufd and device cdev requests and structs, from Linux's
// include/uapi/linux/iommufd.h and vfio.h: iommufd's commands are
// _IO(';', 0x80 + n), the cdev's _IO(';', 100 + 18..20); every struct is
// naturally aligned with __aligned_u64 fields, so its offsets are the sums
// of the sizes before it.
func TestIOMMUFDIoctlNumbersMatchTheKernelHeaders(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" && runtime.GOARCH != "386" && runtime.GOARCH != "riscv64" && runtime.GOARCH != "s390x" && runtime.GOARCH != "loong64" && runtime.GOARCH != "arm" {
		t.Skipf("golden ioctl numbers are for asm-generic ioctl encodings, not %s", runtime.GOARCH)
	}
	golden := []struct {
		name      string
		got, want uint
	}{
		{"VFIO_DEVICE_BIND_IOMMUFD", IoctlDeviceBindIOMMUFD, 0x3b76},
		{"VFIO_DEVICE_ATTACH_IOMMUFD_PT", IoctlDeviceAttachIOMMUFD, 0x3b77},
		{"VFIO_DEVICE_DETACH_IOMMUFD_PT", IoctlDeviceDetachIOMMUFD, 0x3b78},
		{"IOMMU_DESTROY", IoctlIOMMUDestroy, 0x3b80},
		{"IOMMU_IOAS_ALLOC", IoctlIOASAlloc, 0x3b81},
		{"IOMMU_IOAS_ALLOW_IOVAS", IoctlIOASAllowIOVAs, 0x3b82},
		{"IOMMU_IOAS_COPY", IoctlIOASCopy, 0x3b83},
		{"IOMMU_IOAS_IOVA_RANGES", IoctlIOASIOVARanges, 0x3b84},
		{"IOMMU_IOAS_MAP", IoctlIOASMap, 0x3b85},
		{"IOMMU_IOAS_UNMAP", IoctlIOASUnmap, 0x3b86},
		{"IOMMU_OPTION", IoctlIOMMUOption, 0x3b87},
		{"IOMMU_VFIO_IOAS", IoctlIOMMUVFIOIOAS, 0x3b88},
	}
	for _, g := range golden {
		assert.Equal(t, g.want, g.got, g.name)
	}
	assert.Equal(t, 1, IOASMapFixedIOVA, "IOMMU_IOAS_MAP_FIXED_IOVA")
	assert.Equal(t, 2, IOASMapWriteable, "IOMMU_IOAS_MAP_WRITEABLE")
	assert.Equal(t, 4, IOASMapReadable, "IOMMU_IOAS_MAP_READABLE")
}

func TestIOMMUFDLayoutsMatchTheKernelHeaders(t *testing.T) {
	golden := []layout{
		{DeviceBindIOMMUFD{}, 16, map[string]uintptr{"Argsz": 0, "Flags": 4, "IOMMUFD": 8, "OutDevID": 12}},
		{DeviceAttachIOMMUFDPT{}, 12, map[string]uintptr{"Argsz": 0, "Flags": 4, "PTID": 8}},
		{DeviceDetachIOMMUFDPT{}, 8, map[string]uintptr{"Argsz": 0, "Flags": 4}},
		{IOMMUDestroy{}, 8, map[string]uintptr{"Size": 0, "ID": 4}},
		{IOASAlloc{}, 12, map[string]uintptr{"Size": 0, "Flags": 4, "OutIOASID": 8}},
		{IOMMUIOVARange{}, 16, map[string]uintptr{"Start": 0, "Last": 8}},
		{IOASIOVARanges{}, 32, map[string]uintptr{"Size": 0, "IOASID": 4, "NumIOVAs": 8, "Reserved": 12, "AllowedIOVAs": 16, "OutIOVAAlignment": 24}},
		{IOASMap{}, 40, map[string]uintptr{"Size": 0, "Flags": 4, "IOASID": 8, "Reserved": 12, "UserVA": 16, "Length": 24, "IOVA": 32}},
		{IOASUnmap{}, 24, map[string]uintptr{"Size": 0, "IOASID": 4, "IOVA": 8, "Length": 16}},
	}
	checkLayouts(t, golden)
	assert.Equal(t, ioasIOVARangesArrayAt, int(unsafe.Offsetof(IOASIOVARanges{}.AllowedIOVAs)), "where IoctlPtr puts the array")
}
