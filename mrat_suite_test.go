package vfrdma

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// suiteRegisterMRAtCarriesUnalignedMemoryByteForByte: the caller's memory
// at any offset in its page (0, 1, 4095), of 1 byte to three pages,
// registered with RegisterMRAt at its own virtual address (ibv_reg_mr) and
// at another address of the same page offset (ibv_reg_mr_iova), carries RC
// SENDs byte for byte into exactly its bytes (the bytes beside it in its
// pages stay as they were); and two MRs in one page each carry their own
// bytes. In the data-path suite: it runs on QEMU's device in the guest and
// on the model.
func suiteRegisterMRAtCarriesUnalignedMemoryByteForByte(t *testing.T, d *Device) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := newPair(t, d, RC, 8, 64)
	region := func(n int) []byte {
		mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		require.NoError(t, err)
		t.Cleanup(func() { unix.Munmap(mem) })
		return mem
	}
	wcs := make([]WC, 4)
	send := func(src, dst *MR, n int) {
		t.Helper()
		_, err := p.b.PostRecv([]RecvWR{{WRID: 2, SGEs: []SGE{dst.SGE(0, dst.Len())}}}, 0)
		require.NoError(t, err)
		_, err = p.a.PostSend([]SendWR{{WRID: 1, SGEs: []SGE{src.SGE(0, n)}}}, 0)
		require.NoError(t, err)
		for _, c := range []struct {
			cq   *CQ
			wrid uint64
		}{{p.acq, 1}, {p.bcq, 2}} {
			require.Equal(t, 1, pollWait(t, c.cq, wcs[:1]))
			require.Equal(t, WCSuccess, wcs[0].Status, "%+v", wcs[0])
			require.Equal(t, c.wrid, wcs[0].WRID)
		}
		assert.EqualValues(t, n, wcs[0].ByteLen)
	}
	for _, c := range []struct{ off, n int }{{0, 4096}, {1, 1}, {4095, 1}, {4095, 2}, {1, 2 * 4096}, {4095, 4096 + 2}} {
		for _, own := range []bool{true, false} {
			srcPages, dstPages := region(4*4096), region(4*4096)
			for i := range dstPages {
				dstPages[i] = 0xEE
			}
			src, dst := srcPages[c.off:c.off+c.n], dstPages[c.off:c.off+c.n]
			fill(src, c.off+c.n)
			addr := func(b []byte) uint64 {
				if own {
					return uint64(memAddr(b))
				}
				return 0x7f00_1234_5000 + uint64(c.off)
			}
			what := fmt.Sprintf("%d bytes at page offset %d, at address %#x", c.n, c.off, addr(dst))
			smr, err := p.pd.RegisterMRAt(ctx, src, addr(src), 0)
			require.NoError(t, err, what)
			dmr, err := p.pd.RegisterMRAt(ctx, dst, addr(dst), AccessLocalWrite)
			require.NoError(t, err, what)
			send(smr, dmr, c.n)
			require.NoError(t, check(dst, c.off+c.n), what)
			for i, b := range dstPages[:c.off] {
				require.EqualValues(t, 0xEE, b, "%s: byte %d before the MR", what, i)
			}
			for i, b := range dstPages[c.off+c.n:] {
				require.EqualValues(t, 0xEE, b, "%s: byte %d after the MR", what, i)
			}
			require.NoError(t, smr.Close())
			require.NoError(t, dmr.Close())
		}
	}

	// Two MRs in one page, each mapping it at an IOVA of its own; one
	// closed, the other still carries.
	page := region(4096)
	a, b, c := page[100:150], page[2000:2050], page[3000:3050]
	fill(a, 1)
	amr, err := p.pd.RegisterMRAt(ctx, a, uint64(memAddr(a)), 0)
	require.NoError(t, err)
	bmr, err := p.pd.RegisterMRAt(ctx, b, uint64(memAddr(b)), AccessLocalWrite)
	require.NoError(t, err)
	send(amr, bmr, 50)
	require.NoError(t, check(b, 1), "the first MR's bytes in the second")
	require.NoError(t, amr.Close())
	cmr, err := p.pd.RegisterMRAt(ctx, c, uint64(memAddr(c)), AccessLocalWrite)
	require.NoError(t, err)
	fill(b, 2)
	send(bmr, cmr, 50)
	require.NoError(t, check(c, 2), "the second MR's bytes in the third, after the first's close")
	require.NoError(t, bmr.Close())
	require.NoError(t, cmr.Close())
}
