package uapi

// Ioctl request numbers. vfio.h defines every request as
// _IO(VFIO_TYPE, VFIO_BASE + n) with VFIO_TYPE ';' and VFIO_BASE 100: no size
// and no direction are encoded, since each struct carries its own argsz.
const (
	vfioType = ';'
	vfioBase = 100
)

// ioBase is _IO(VFIO_TYPE, VFIO_BASE); request n is ioBase + n.
const ioBase uint = iocNone<<iocDirShift | vfioType<<8 | vfioBase

// Container (/dev/vfio/vfio) requests.
const (
	IoctlGetAPIVersion  = ioBase + 0  // VFIO_GET_API_VERSION: returns the API version
	IoctlCheckExtension = ioBase + 1  // VFIO_CHECK_EXTENSION: integer arg, returns > 0 if supported
	IoctlSetIOMMU       = ioBase + 2  // VFIO_SET_IOMMU: integer arg (IOMMU type)
	IoctlIOMMUGetInfo   = ioBase + 12 // VFIO_IOMMU_GET_INFO: IOMMUType1Info + caps
	IoctlIOMMUMapDMA    = ioBase + 13 // VFIO_IOMMU_MAP_DMA: DMAMap
	IoctlIOMMUUnmapDMA  = ioBase + 14 // VFIO_IOMMU_UNMAP_DMA: DMAUnmap, size written back
)

// Group (/dev/vfio/N) requests.
const (
	IoctlGroupGetStatus      = ioBase + 3 // VFIO_GROUP_GET_STATUS: GroupStatus
	IoctlGroupSetContainer   = ioBase + 4 // VFIO_GROUP_SET_CONTAINER: pointer to s32 container fd
	IoctlGroupUnsetContainer = ioBase + 5 // VFIO_GROUP_UNSET_CONTAINER: no arg
	IoctlGroupGetDeviceFD    = ioBase + 6 // VFIO_GROUP_GET_DEVICE_FD: NUL-terminated device name, returns an fd
)

// Device requests.
const (
	IoctlDeviceGetInfo       = ioBase + 7  // VFIO_DEVICE_GET_INFO: DeviceInfo + caps
	IoctlDeviceGetRegionInfo = ioBase + 8  // VFIO_DEVICE_GET_REGION_INFO: RegionInfo + caps
	IoctlDeviceGetIRQInfo    = ioBase + 9  // VFIO_DEVICE_GET_IRQ_INFO: IRQInfo
	IoctlDeviceSetIRQs       = ioBase + 10 // VFIO_DEVICE_SET_IRQS: IRQSet + data
	IoctlDeviceReset         = ioBase + 11 // VFIO_DEVICE_RESET: no arg
)

// API version and extensions (VFIO_CHECK_EXTENSION arguments).
const (
	APIVersion = 0 // VFIO_API_VERSION

	Type1IOMMU   = 1 // VFIO_TYPE1_IOMMU
	Type1v2IOMMU = 3 // VFIO_TYPE1v2_IOMMU
	DMACCIOMMU   = 4 // VFIO_DMA_CC_IOMMU
	NoIOMMU      = 8 // VFIO_NOIOMMU_IOMMU
	UnmapAll     = 9 // VFIO_UNMAP_ALL
)

// GroupStatus.Flags.
const (
	GroupFlagsViable       = 1 << 0 // VFIO_GROUP_FLAGS_VIABLE
	GroupFlagsContainerSet = 1 << 1 // VFIO_GROUP_FLAGS_CONTAINER_SET
)

// DeviceInfo.Flags.
const (
	DeviceFlagsReset = 1 << 0 // VFIO_DEVICE_FLAGS_RESET: VFIO_DEVICE_RESET works
	DeviceFlagsPCI   = 1 << 1 // VFIO_DEVICE_FLAGS_PCI
	DeviceFlagsCaps  = 1 << 7 // VFIO_DEVICE_FLAGS_CAPS: CapOffset is valid
)

// RegionInfo.Flags.
const (
	RegionInfoFlagRead  = 1 << 0 // VFIO_REGION_INFO_FLAG_READ
	RegionInfoFlagWrite = 1 << 1 // VFIO_REGION_INFO_FLAG_WRITE
	RegionInfoFlagMmap  = 1 << 2 // VFIO_REGION_INFO_FLAG_MMAP
	RegionInfoFlagCaps  = 1 << 3 // VFIO_REGION_INFO_FLAG_CAPS
)

// Region capability IDs.
const (
	RegionInfoCapSparseMmapID   = 1 // VFIO_REGION_INFO_CAP_SPARSE_MMAP
	RegionInfoCapTypeID         = 2 // VFIO_REGION_INFO_CAP_TYPE
	RegionInfoCapMSIXMappableID = 3 // VFIO_REGION_INFO_CAP_MSIX_MAPPABLE (header only)
)

// vfio-pci region indexes.
const (
	PCIBAR0RegionIndex   = 0
	PCIBAR5RegionIndex   = 5
	PCIROMRegionIndex    = 6
	PCIConfigRegionIndex = 7
	PCIVGARegionIndex    = 8
	PCINumRegions        = 9
)

// IRQInfo.Flags.
const (
	IRQInfoEventfd    = 1 << 0 // VFIO_IRQ_INFO_EVENTFD
	IRQInfoMaskable   = 1 << 1 // VFIO_IRQ_INFO_MASKABLE
	IRQInfoAutomasked = 1 << 2 // VFIO_IRQ_INFO_AUTOMASKED
	IRQInfoNoResize   = 1 << 3 // VFIO_IRQ_INFO_NORESIZE
)

// IRQSet.Flags.
const (
	IRQSetDataNone      = 1 << 0 // VFIO_IRQ_SET_DATA_NONE
	IRQSetDataBool      = 1 << 1 // VFIO_IRQ_SET_DATA_BOOL
	IRQSetDataEventfd   = 1 << 2 // VFIO_IRQ_SET_DATA_EVENTFD: data is s32 fds, -1 to de-assign
	IRQSetActionMask    = 1 << 3 // VFIO_IRQ_SET_ACTION_MASK
	IRQSetActionUnmask  = 1 << 4 // VFIO_IRQ_SET_ACTION_UNMASK
	IRQSetActionTrigger = 1 << 5 // VFIO_IRQ_SET_ACTION_TRIGGER
)

// vfio-pci IRQ indexes.
const (
	PCIINTxIRQIndex = 0
	PCIMSIIRQIndex  = 1
	PCIMSIXIRQIndex = 2
	PCIErrIRQIndex  = 3
	PCIReqIRQIndex  = 4
	PCINumIRQs      = 5
)

// IOMMUType1Info.Flags.
const (
	IOMMUInfoPgsizes = 1 << 0 // VFIO_IOMMU_INFO_PGSIZES: IOVAPgsizes is valid
	IOMMUInfoCaps    = 1 << 1 // VFIO_IOMMU_INFO_CAPS: CapOffset is valid
)

// IOMMU info capability IDs.
const (
	IOMMUType1InfoCapIOVARangeID = 1 // VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE
	IOMMUType1InfoCapMigrationID = 2 // VFIO_IOMMU_TYPE1_INFO_CAP_MIGRATION
	IOMMUType1InfoDMAAvailID     = 3 // VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL
)

// DMAMap.Flags and DMAUnmap.Flags.
const (
	DMAMapFlagRead  = 1 << 0 // VFIO_DMA_MAP_FLAG_READ: the device may read
	DMAMapFlagWrite = 1 << 1 // VFIO_DMA_MAP_FLAG_WRITE: the device may write
	DMAUnmapFlagAll = 1 << 1 // VFIO_DMA_UNMAP_FLAG_ALL (needs the UnmapAll extension)
)

// InfoCapHeader starts every capability in an info buffer (struct
// vfio_info_cap_header). Next is the offset of the next capability from the
// start of the whole info buffer, 0 at the end of the chain.
type InfoCapHeader struct {
	ID      uint16
	Version uint16
	Next    uint32
}

// GroupStatus is struct vfio_group_status.
type GroupStatus struct {
	Argsz uint32
	Flags uint32
}

// DeviceInfo is struct vfio_device_info.
type DeviceInfo struct {
	Argsz      uint32
	Flags      uint32
	NumRegions uint32 // max region index + 1
	NumIRQs    uint32 // max IRQ index + 1
	CapOffset  uint32 // first capability, valid with DeviceFlagsCaps
}

// RegionInfo is struct vfio_region_info.
type RegionInfo struct {
	Argsz     uint32
	Flags     uint32
	Index     uint32
	CapOffset uint32 // first capability, valid with RegionInfoFlagCaps
	Size      uint64 // bytes; 0 for an unimplemented region
	Offset    uint64 // where the region starts in the device fd (for pread, pwrite, mmap)
}

// RegionSparseMmapArea is struct vfio_region_sparse_mmap_area.
type RegionSparseMmapArea struct {
	Offset uint64 // from the start of the region
	Size   uint64
}

// RegionInfoCapSparseMmap is struct vfio_region_info_cap_sparse_mmap without
// its flexible array of NrAreas RegionSparseMmapArea.
type RegionInfoCapSparseMmap struct {
	Header   InfoCapHeader
	NrAreas  uint32
	Reserved uint32
}

// RegionInfoCapType is struct vfio_region_info_cap_type.
type RegionInfoCapType struct {
	Header  InfoCapHeader
	Type    uint32
	Subtype uint32
}

// IRQInfo is struct vfio_irq_info.
type IRQInfo struct {
	Argsz uint32
	Flags uint32
	Index uint32
	Count uint32 // number of vectors in this index
}

// IRQSet is struct vfio_irq_set without its flexible data array.
type IRQSet struct {
	Argsz uint32
	Flags uint32
	Index uint32
	Start uint32
	Count uint32
}

// IOMMUType1Info is struct vfio_iommu_type1_info, trailing padding made
// explicit.
type IOMMUType1Info struct {
	Argsz       uint32
	Flags       uint32
	IOVAPgsizes uint64 // bitmap of supported IOMMU page sizes
	CapOffset   uint32 // first capability, valid with IOMMUInfoCaps
	_           [4]byte
}

// IOVARange is struct vfio_iova_range; End is inclusive.
type IOVARange struct {
	Start uint64
	End   uint64
}

// IOMMUType1InfoCapIOVARange is struct vfio_iommu_type1_info_cap_iova_range
// without its flexible array of NrIOVAs IOVARange.
type IOMMUType1InfoCapIOVARange struct {
	Header   InfoCapHeader
	NrIOVAs  uint32
	Reserved uint32
}

// IOMMUType1InfoCapMigration is struct vfio_iommu_type1_info_cap_migration,
// padding made explicit.
type IOMMUType1InfoCapMigration struct {
	Header             InfoCapHeader
	Flags              uint32
	_                  [4]byte
	PgsizeBitmap       uint64
	MaxDirtyBitmapSize uint64
}

// IOMMUType1InfoDMAAvail is struct vfio_iommu_type1_info_dma_avail.
type IOMMUType1InfoDMAAvail struct {
	Header InfoCapHeader
	Avail  uint32 // DMA mappings that may still be created
}

// DMAMap is struct vfio_iommu_type1_dma_map.
type DMAMap struct {
	Argsz uint32
	Flags uint32
	Vaddr uint64 // process virtual address
	IOVA  uint64
	Size  uint64
}

// DMAUnmap is struct vfio_iommu_type1_dma_unmap without its flexible data
// (used only with the dirty-bitmap flag, which this driver does not use).
type DMAUnmap struct {
	Argsz uint32
	Flags uint32
	IOVA  uint64
	Size  uint64 // in: bytes to unmap; out: bytes unmapped
}
