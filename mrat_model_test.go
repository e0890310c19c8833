package vfrdma_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
)

// The caller's memory registered at an address of its choosing
// (PD.RegisterMRAt, what libibverbs' ibv_reg_mr and ibv_reg_mr_iova do).

// pages maps n fresh pages of 4 KiB (the device's page; the host's may be
// larger), off the Go heap, unmapped when the test ends.
func pages(t *testing.T, n int) []byte {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, n*4096+unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem) })
	return mem
}

func vaOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// sendRecv sends all of src's MR in one SEND into all of dst's MR through
// the pair's QPs and waits for both completions.
func sendRecv(t *testing.T, p *rcPair, src, dst *vfrdma.MR) {
	t.Helper()
	sendRecvSGE(t, p, src.SGE(0, src.Len()), dst.SGE(0, dst.Len()))
}

func sendRecvSGE(t *testing.T, p *rcPair, src, dst vfrdma.SGE) {
	t.Helper()
	ctx := ctxT(t)
	_, err := p.b.PostRecv([]vfrdma.RecvWR{{WRID: 2, SGEs: []vfrdma.SGE{dst}}}, 0)
	require.NoError(t, err)
	_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 1, SGEs: []vfrdma.SGE{src}}}, 0)
	require.NoError(t, err)
	for _, wc := range waitWCs(t, ctx, p.cq, 2) {
		require.Equal(t, vfrdma.WCSuccess, wc.Status, "%+v", wc)
		if wc.WRID == 2 {
			assert.EqualValues(t, src.Length, wc.ByteLen)
		}
	}
}

// Unaligned memory (at offset 1 and 4095 of a page, of 1 byte and spanning
// three pages) registered at its own virtual address and at an address of
// another page with the same in-page offset carries a SEND byte for byte,
// into exactly its bytes: the bytes beside it in its pages stay as they
// were. On every device: QEMU's, which needs an MR's pages to number its
// length in pages, too.
func TestRegisterMRAtCarriesUnalignedMemoryByteForByteAtItsAddress(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  pvsim.Config
	}{{"qemu", pvsim.Config{QEMU: true}}, {"v18", vmware(18)}, {"v20", vmware(20)}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			d, m := openModel(t, tc.cfg, nil)
			p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
			for _, c := range []struct{ off, n int }{{1, 1}, {4095, 1}, {1, 2 * 4096}, {4095, 4096 + 2}, {4095, 2}} {
				for _, own := range []bool{true, false} {
					t.Run(fmt.Sprintf("offset %d length %d own %v", c.off, c.n, own), func(t *testing.T) {
						srcPages, dstPages := pages(t, 4), pages(t, 4)
						for i := range dstPages {
							dstPages[i] = 0xEE
						}
						src, dst := srcPages[c.off:c.off+c.n], dstPages[c.off:c.off+c.n]
						for i := range src {
							src[i] = byte(rand.Uint32())
						}
						addr := func(b []byte) uint64 {
							if own {
								return vaOf(b)
							}
							return 0x7f00_1234_5000 + uint64(c.off)
						}
						smr, err := p.pd.RegisterMRAt(ctx, src, addr(src), 0)
						require.NoError(t, err)
						defer smr.Close()
						dmr, err := p.pd.RegisterMRAt(ctx, dst, addr(dst), vfrdma.AccessLocalWrite)
						require.NoError(t, err)
						defer dmr.Close()
						assert.Equal(t, addr(dst), dmr.Addr())
						assert.Equal(t, c.n, dmr.Len())
						sendRecv(t, p, smr, dmr)
						assert.Equal(t, src, dst, "the message, byte for byte")
						for i, b := range dstPages[:c.off] {
							require.EqualValues(t, 0xEE, b, "byte %d before the MR", i)
						}
						for i, b := range dstPages[c.off+c.n:] {
							require.EqualValues(t, 0xEE, b, "byte %d after the MR", i)
						}
					})
				}
			}
			assert.Empty(t, m.Hazards())
		})
	}
}

// Two MRs in one page (many small buffers of one allocator) each map the
// page at an IOVA of their own: each carries its own bytes, and closing one
// leaves the other working.
func TestTwoMRsSharingAPageEachCarryTheirOwnBytes(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  pvsim.Config
	}{{"qemu", pvsim.Config{QEMU: true}}, {"v20", vmware(20)}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			d, m := openModel(t, tc.cfg, nil)
			p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
			page := pages(t, 1)
			src, dst, third := page[100:150], page[2000:2050], page[3000:3050]
			copy(src, "fifty bytes from the first MR of the shared page.")
			smr, err := p.pd.RegisterMRAt(ctx, src, vaOf(src), 0)
			require.NoError(t, err)
			dmr, err := p.pd.RegisterMRAt(ctx, dst, vaOf(dst), vfrdma.AccessLocalWrite)
			require.NoError(t, err)
			sendRecv(t, p, smr, dmr)
			assert.Equal(t, src, dst)

			require.NoError(t, smr.Close())
			tmr, err := p.pd.RegisterMRAt(ctx, third, vaOf(third), vfrdma.AccessLocalWrite)
			require.NoError(t, err)
			copy(dst, "the second MR, after the first one's close, sends.")
			sendRecv(t, p, dmr, tmr)
			assert.Equal(t, dst, third)
			require.NoError(t, dmr.Close())
			require.NoError(t, tmr.Close())
			assert.Empty(t, m.Hazards())
		})
	}
}

// An SGE may reach the MR's last byte and not one byte past it, counted
// from the MR's address (not the IOVA its pages are mapped at).
func TestAnSGEReachesTheLastByteOfAnMRAtItsAddressAndNotOnePast(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	mem := pages(t, 2)[0x678 : 0x678+1000]
	mr, err := p.pd.RegisterMRAt(ctx, mem, 0x7f00_1234_5678, vfrdma.AccessLocalWrite)
	require.NoError(t, err)
	for _, s := range []vfrdma.SGE{mr.SGE(0, 1000), mr.SGE(999, 1), {Addr: 0x7f00_1234_5678 + 1000, Length: 0, LKey: mr.LKey()}} {
		_, err = p.b.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{s}}}, 0)
		assert.NoError(t, err, "SGE %+v of an MR of 1000 bytes at 0x7f0012345678", s)
	}
	for _, s := range []vfrdma.SGE{mr.SGE(0, 1001), mr.SGE(999, 2), mr.SGE(1000, 1), mr.SGE(-1, 1)} {
		_, err = p.b.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{s}}}, 0)
		assert.ErrorIs(t, err, vfrdma.ErrInvalid, "SGE %+v of an MR of 1000 bytes at 0x7f0012345678", s)
	}
}

// An MR may start at address 0 and end at the last address, 2^64-1, and
// carries data between the two; one that would pass 2^64 by a byte is
// refused.
func TestAnMRAtMayLieAnywhereBelow2To64AndNotPastIt(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	mem := pages(t, 4)
	zero, err := p.pd.RegisterMRAt(ctx, mem[:4096], 0, vfrdma.AccessLocalWrite)
	require.NoError(t, err, "an MR at address 0")
	assert.Zero(t, zero.Addr())
	top, err := p.pd.RegisterMRAt(ctx, mem[4096+1:2*4096], math.MaxUint64-4095+1, vfrdma.AccessLocalWrite)
	require.NoError(t, err, "an MR whose last byte is at 2^64-1")
	assert.EqualValues(t, uint64(math.MaxUint64), top.Addr()+uint64(top.Len())-1)
	for i := range 4095 {
		mem[i] = byte(i * 7)
	}
	sendRecvSGE(t, p, zero.SGE(0, 4095), top.SGE(0, 4095))
	assert.Equal(t, mem[:4095], mem[4097:2*4096])
	copy(mem[4097:], "back down from the top")
	sendRecvSGE(t, p, top.SGE(0, 4095), zero.SGE(1, 4095))
	assert.Equal(t, mem[4097:2*4096], mem[1:4096])

	_, err = p.pd.RegisterMRAt(ctx, mem[2*4096+1:3*4096+1], math.MaxUint64-4095+1, vfrdma.AccessLocalWrite)
	assert.ErrorIs(t, err, vfrdma.ErrInvalid, "an MR whose last byte would be at 2^64")
	assert.Len(t, m.MRs(), 3, "the refused MR reached no device")
}

// The address must sit at the memory's offset in its 4 KiB page (the
// device reaches the MR through whole pages from the one holding its first
// byte): an address at another offset is refused.
func TestRegisterMRAtRefusesAnAddressAtAnotherPageOffsetThanTheMemory(t *testing.T) {
	ctx := ctxT(t)
	d, _ := openModel(t, vmware(20), nil)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	mem := pages(t, 1)[0x678:0x700]
	for _, addr := range []uint64{0x7f00_1234_5000, 0x7f00_1234_5677, 0x7f00_1234_5679, vaOf(mem) + 1} {
		_, err := pd.RegisterMRAt(ctx, mem, addr, vfrdma.AccessLocalWrite)
		assert.ErrorIs(t, err, vfrdma.ErrInvalid, "memory at page offset 0x678, address %#x", addr)
	}
	mr, err := pd.RegisterMRAt(ctx, mem, 0x7f00_1234_5678, vfrdma.AccessLocalWrite)
	require.NoError(t, err)
	require.NoError(t, mr.Close())
}

// An MR at an address may be as long as max_mr_size and not a byte
// longer, at any alignment.
func TestRegisterMRAtMayBeAsLongAsMaxMRSizeAndNotAByteLonger(t *testing.T) {
	const limit = 64 << 10
	d, _ := openModel(t, pvsim.Config{Version: 20, Caps: func(c *firmware.Caps) { c.MaxMRSize = limit }}, nil)
	ctx := ctxT(t)
	pd, err := d.AllocPD(ctx)
	require.NoError(t, err)
	mem := pages(t, limit/4096+2)
	for _, off := range []int{0, 1, 4095} {
		mr, err := pd.RegisterMRAt(ctx, mem[off:off+limit], vaOf(mem[off:]), vfrdma.AccessLocalWrite)
		require.NoError(t, err, "max_mr_size bytes at page offset %d", off)
		require.NoError(t, mr.Close())
		_, err = pd.RegisterMRAt(ctx, mem[off:off+limit+1], vaOf(mem[off:]), vfrdma.AccessLocalWrite)
		assert.ErrorIs(t, err, vfrdma.ErrInvalid, "a byte past max_mr_size at page offset %d", off)
	}
	_, err = pd.RegisterMRAt(ctx, mem[:0], vaOf(mem), vfrdma.AccessLocalWrite)
	assert.ErrorIs(t, err, vfrdma.ErrInvalid, "no bytes")
}

// Once an MR registered at an address is closed, posts naming its key are
// refused, and its pages are no longer mapped for the device.
func TestAClosedMRAtsKeyIsRefused(t *testing.T) {
	ctx := ctxT(t)
	d, m := openModel(t, vmware(20), nil)
	p := newRCPair(t, ctx, d, true, vfrdma.AccessLocalWrite)
	dma := m.DMA()
	mem := pages(t, 2)[100 : 100+5000]
	mr, err := p.pd.RegisterMRAt(ctx, mem, vaOf(mem), vfrdma.AccessLocalWrite)
	require.NoError(t, err)
	_, err = p.b.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{mr.SGE(0, 5000)}}}, 0)
	require.NoError(t, err)
	require.NoError(t, mr.Close())
	_, err = p.b.PostRecv([]vfrdma.RecvWR{{WRID: 2, SGEs: []vfrdma.SGE{mr.SGE(0, 5000)}}}, 0)
	assert.ErrorIs(t, err, vfrdma.ErrPrivileges, "a receive naming the closed MR's key")
	_, err = p.a.PostSend([]vfrdma.SendWR{{WRID: 3, SGEs: []vfrdma.SGE{mr.SGE(0, 1)}}}, 0)
	assert.ErrorIs(t, err, vfrdma.ErrPrivileges, "a send naming the closed MR's key")
	assert.Nil(t, mr.Bytes())
	assert.Equal(t, dma, m.DMA(), "the MR's pages and directory are unmapped")
}

// A peer's RDMA WRITE and READ name an MR registered at an address by that
// address: they reach its first and its last byte, and one byte past is a
// remote access error.
func TestOneSidedOperationsReachAnMRAtItsAddressToItsLastByteAndNotPast(t *testing.T) {
	const addr, n = 0x7f00_1234_5678, 5000
	all := vfrdma.AccessLocalWrite | vfrdma.AccessRemoteWrite | vfrdma.AccessRemoteRead
	for _, op := range []vfrdma.Opcode{vfrdma.OpRDMAWrite, vfrdma.OpRDMARead} {
		t.Run(fmt.Sprint(op), func(t *testing.T) {
			ctx := ctxT(t)
			d, _ := openModel(t, vmware(20), nil)
			p := newRCPair(t, ctx, d, true, all)
			local := p.mr.Bytes()
			mem := pages(t, 3)[0x678 : 0x678+n]
			target, err := p.pd.RegisterMRAt(ctx, mem, addr, all)
			require.NoError(t, err)
			one := func(wrid uint64, remote uint64, length int) vfrdma.WC {
				_, err := p.a.PostSend([]vfrdma.SendWR{{WRID: wrid, Opcode: op, SGEs: []vfrdma.SGE{p.mr.SGE(0, length)}, RemoteAddr: remote, RKey: target.RKey()}}, 0)
				require.NoError(t, err)
				return waitWCs(t, ctx, p.cq, 1)[0]
			}
			for _, c := range []struct {
				at, length int
			}{{0, 16}, {n - 1, 1}, {n - 16, 16}, {0, n}} {
				for i := range c.length {
					local[i] = byte(rand.Uint32())
					mem[c.at+i] = byte(rand.Uint32())
				}
				wc := one(1, addr+uint64(c.at), c.length)
				require.Equal(t, vfrdma.WCSuccess, wc.Status, "%d bytes at offset %d: %+v", c.length, c.at, wc)
				assert.Equal(t, local[:c.length], mem[c.at:c.at+c.length], "%d bytes at offset %d", c.length, c.at)
			}
			wc := one(2, addr+n-1, 2)
			assert.Equal(t, vfrdma.WCRemAccessErr, wc.Status, "2 bytes from the last byte: %+v", wc)
		})
	}
}
