package vmxnet3

// Register and memory layouts of the vmxnet3 function (revision 1, UPT
// version 1), from docs/vmxnet3.md. All little-endian.

// BAR0 ("PT") registers, 8 bytes apart.
const (
	regIMR    = 0x000 // + 8·vector: non-zero masks, 0 unmasks
	regTXPROD = 0x600 // + 8·queue: the transmit doorbell
	regRXPROD = 0x800 // + 8·queue: rx ring 0 producer (QEMU ignores it)
)

// BAR1 ("VD") registers, 8 bytes apart. Only 32-bit accesses: a 64-bit
// store is split at 4 bytes, and DSAH is 8 bytes after DSAL.
const (
	regVRRS = 0x00 // device revisions: bit 0 is revision 1
	regUVRS = 0x08 // UPT versions: bit 0 is version 1
	regDSAL = 0x10 // driver-shared area IOVA, low half (0 deactivates)
	regDSAH = 0x18 // and high half
	regCMD  = 0x20 // command; read back for its result
	regMACL = 0x28
	regMACH = 0x30
	regECR  = 0x40 // write 1s to clear event bits in the shared area
)

// Commands written to CMD.
const (
	cmdActivate   = 0xCAFE0000
	cmdQuiesce    = 0xCAFE0001
	cmdReset      = 0xCAFE0002
	cmdRxMode     = 0xCAFE0003
	cmdGetStats   = 0xF00D0001
	cmdGetLink    = 0xF00D0002
	cmdGetPermMAC = 0xF00D0003 // _LO; _HI is +1
)

// Driver-shared area (720 bytes).
const (
	sharedSize       = 720
	sharedMagic      = 0xBABEFEE1
	shMagic          = 0x000
	shGOS            = 0x00C
	shRevSpt         = 0x010
	shUPTVerSpt      = 0x014
	shUPTFeatures    = 0x018
	shQueueDescPA    = 0x028
	shQueueDescLen   = 0x034
	shMTU            = 0x038
	shMaxRxSG        = 0x03C
	shNumTxQueues    = 0x03E
	shNumRxQueues    = 0x03F
	shAutoMask       = 0x050
	shNumIntrs       = 0x051
	shEventIntrIdx   = 0x052
	shIntrCtrl       = 0x06C
	shRxMode         = 0x078
	shVFTable        = 0x088
	shECR            = 0x2B8
	gos64Linux       = 0x6 // 64-bit (bits 1:0 = 2), Linux (bits 5:2 = 1)
	intrCtrlDisable  = 1
	rxModeUcast      = 0x01
	rxModeMcast      = 0x02
	rxModeBcast      = 0x04
	rxModeAllMulti   = 0x08
	rxModePromisc    = 0x10
	ecrLink          = 1 << 2
	queueDescSize    = 256
	queueDescAlign   = 128
	ringAlign        = 512
	descSize         = 16
	linkUp           = 1
	maxRingSize      = 4096
	ringSizeMultiple = 32
)

// Queue descriptors (256 bytes each; the tx one first).
const (
	tqRingPA     = 0x10
	tqCompPA     = 0x20
	tqRingSize   = 0x38
	tqCompSize   = 0x40
	tqIntrIdx    = 0x48
	tqStats      = 0x58
	rqRing0PA    = 0x10
	rqRing1PA    = 0x18
	rqCompPA     = 0x20
	rqRing0Size  = 0x38
	rqRing1Size  = 0x3C
	rqCompSize   = 0x40
	rqIntrIdx    = 0x48
	rqStats      = 0x58
	statsEntries = 10 // u64 counters in each queue's stats block
)

// Descriptor bits.
const (
	txLenMask  = 0x3FFF  // dword 2
	txGen      = 1 << 14 // dword 2
	txEOP      = 1 << 12 // dword 3
	txCQ       = 1 << 13 // dword 3
	txCompIdx  = 0xFFF   // completion dword 0
	compGen    = 1 << 31 // completion dword 3 (tx and rx)
	rxLenMask  = 0x3FFF  // rx descriptor dword 2; rx completion dword 2
	rxGen      = 1 << 31 // rx descriptor dword 2
	rxcIdxMask = 0xFFF   // rx completion dword 0
	rxcEOP     = 1 << 14
	rxcSOP     = 1 << 15
	rxcRqShift = 16
	rxcRqMask  = 0x3FF
	rxcErr     = 1 << 14 // rx completion dword 2
)

// Interrupt indexes (MSI-X vectors) the driver configures.
const (
	vecRx    = 0
	vecTx    = 1
	vecEvent = 2
	numVecs  = 3
)
