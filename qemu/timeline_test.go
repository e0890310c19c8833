package qemu

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A timeline is read from QEMU 7.2's log lines as -msg timestamp=on
// writes them (thread@seconds.microseconds:event args); lines of other
// shapes are skipped, and a traced event whose fields do not parse is an
// error rather than a hole in the timeline.
func TestTimelineReadsQEMUsTraceLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vm0.trace")
	require.NoError(t, os.WriteFile(path, []byte(
		"qemu-system-x86_64: some warning\n"+
			"23362@1795667870.471831:pvrdma_uar_write uar[0x0]=0x40000010 (cls=QP, op=SEND, obj=16, val=0)\n"+
			"23370@1795667870.472096:pvrdma_post_cqe cq_handle=3, notify=0, wr_id=0x2c, qpn=0x10, opcode=128, status=0, byte_len=64, src_qp=16, wc_flags=0, vendor_err=0\n"+
			"23362@1795667870.472145:pvrdma_regs_write addr=0x0 val=0x1\n"), 0o644))
	evs, err := readTimeline(path)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	assert.Equal(t, DeviceEvent{At: time.Unix(1795667870, 471831000), Thread: 23362, Kind: "QP SEND", Obj: 16}, evs[0])
	assert.Equal(t, DeviceEvent{At: time.Unix(1795667870, 472096000), Thread: 23370, Kind: CQEKind, Obj: 3,
		Opcode: CQERecv, ByteLen: 64, QPN: 0x10, WRID: 0x2c}, evs[1])

	for _, bad := range []string{
		"23362@1795667870.4718:pvrdma_uar_write uar[0x0]=0x40000010 (cls=QP, op=SEND, obj=16, val=0)", // not microseconds
		"x@1795667870.471831:pvrdma_uar_write uar[0x0]=0x40000010 (cls=QP, op=SEND, obj=16, val=0)",
		"23362@1795667870.471831:pvrdma_uar_write uar[0x0]=0x40000010",
		"23370@1795667870.472096:pvrdma_post_cqe cq_handle=3, notify=0, wr_id=0x2c, qpn=0x10, status=0",
	} {
		require.NoError(t, os.WriteFile(path, []byte(bad+"\n"), 0o644))
		_, err := readTimeline(path)
		assert.Error(t, err, bad)
	}
}
