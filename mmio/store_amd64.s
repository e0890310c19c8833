#include "textflag.h"

// func storeU32(p *uint32, v uint32)
// One plain 32-bit store: no LOCK prefix, no XCHG, no read of the target.
TEXT ·storeU32(SB), NOSPLIT, $0-12
	MOVQ p+0(FP), AX
	MOVL v+8(FP), BX
	MOVL BX, (AX)
	RET

// func storeU64(p *uint64, v uint64)
// One plain 64-bit store.
TEXT ·storeU64(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), AX
	MOVQ v+8(FP), BX
	MOVQ BX, (AX)
	RET
