package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/internal/perf"
	"github.com/vfrdma/vfrdma/pvsim"
)

// pingpong --srq --rdma-core between two pvctl ends, each on a model of
// its own on one fabric, over loopback TCP in ibv_srq_pingpong's exchange:
// iters round trips over all the QPs, every byte checked (zeros), each
// side's SRQ consuming exactly iters receives.
func TestSRQPingpongRDMACoreBetweenTwoEnds(t *testing.T) {
	var srv, cli pingpongResult
	args := []string{"--rdma-core", "--srq", "4", "--size", "512", "--iters", "50"}
	e1, e2 := twoEnds(t, cmdPingpong, args, args, &srv, &cli)
	require.NoError(t, e1, "server")
	require.NoError(t, e2, "client")
	for _, r := range []pingpongResult{srv, cli} {
		assert.Equal(t, pingpongResult{Transport: "RC", SRQQPs: 4, Size: 512, Iters: 50, Checked: true, Wait: "spin"}, stripTimes(withoutDoorbells(r)))
		assert.Positive(t, r.SRQDoorbellsPerRecv)
	}
}

func withoutDoorbells(r pingpongResult) pingpongResult {
	r.SRQDoorbellsPerRecv = 0
	return r
}

// fakeSRQPingpong does on the wire and on a device model what rdma-core's
// ibv_srq_pingpong does (libibverbs/examples/srq_pingpong.c): q RC QPs on
// one SRQ of rxDepth receives, all into its one zeroed buffer of size
// bytes, from which it also sends; 256 address messages each way (its
// QPs', then zeros), the client's first, the server's after it connected
// its QPs, then the client's "done"; its receives posted before the
// exchange. The client sends once on every QP, and then on a QP whenever
// both its last send there completed and a message arrived there, while
// fewer than iters of its sends completed; the server likewise, its first
// send on a QP waiting for a message there. Each stops once iters sends
// completed and iters messages arrived, in all.
type fakeSRQPingpong struct {
	q, iters, size, rxDepth int
	fab                     *pvsim.Fabric
}

// run runs it: as the client with a peer address (retrying the dial), as
// the server on ln otherwise. It returns the messages it received and
// the sends it completed.
func (f *fakeSRQPingpong) run(ctx context.Context, ln net.Listener, peer string) (rcnt, scnt int, err error) {
	m, err := pvsim.New(pvsim.Config{Fabric: f.fab})
	if err != nil {
		return 0, 0, err
	}
	defer m.Close()
	d, err := vfrdma.OpenFunction(m, nil)
	if err != nil {
		return 0, 0, err
	}
	defer d.Close()
	pd, err := d.AllocPD(ctx)
	if err != nil {
		return 0, 0, err
	}
	cq, err := d.CreateCQ(ctx, f.rxDepth+f.q)
	if err != nil {
		return 0, 0, err
	}
	srq, err := pd.CreateSRQ(ctx, &vfrdma.SRQConfig{Depth: f.rxDepth, CQ: cq})
	if err != nil {
		return 0, 0, err
	}
	mr, err := pd.AllocMR(ctx, f.size, vfrdma.AccessLocalWrite)
	if err != nil {
		return 0, 0, err
	}
	clear(mr.Bytes())
	const recvWRID, sendWRID = 1, 2
	qps := make([]*vfrdma.QP, f.q)
	psns := make([]uint32, f.q)
	for i := range qps {
		if qps[i], err = pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SRQ: srq, SendDepth: 1, SignalAll: true}); err != nil {
			return 0, 0, err
		}
		psns[i] = rand.Uint32() & 0xffffff
	}
	postRecvs := func(n int) error {
		wrs := make([]vfrdma.RecvWR, n)
		for i := range wrs {
			wrs[i] = vfrdma.RecvWR{WRID: recvWRID, SGEs: []vfrdma.SGE{mr.SGE(0, f.size)}}
		}
		_, err := srq.PostRecv(wrs, 0)
		return err
	}
	routs := f.rxDepth
	if err := postRecvs(routs); err != nil {
		return 0, 0, err
	}

	// The exchange.
	var mine []byte
	for i := range 256 {
		var qpn, psn uint32
		var gid vfrdma.GID
		if i < f.q {
			qpn, psn, gid = qps[i].QPN(), psns[i], d.GID()
		}
		mine = fmt.Appendf(mine, "%04x:%06x:%06x:%s\x00", 0, qpn, psn, hex.EncodeToString(gid[:]))
	}
	type dest struct {
		qpn, psn uint32
		gid      vfrdma.GID
	}
	read := func(c net.Conn) ([]dest, error) {
		b := make([]byte, 256*52)
		if _, err := io.ReadFull(c, b); err != nil {
			return nil, err
		}
		ds := make([]dest, 256)
		for i := range ds {
			f := strings.Split(strings.TrimRight(string(b[i*52:(i+1)*52]), "\x00"), ":")
			if len(f) != 4 {
				return nil, fmt.Errorf("message %d: %q", i, b[i*52:(i+1)*52])
			}
			qpn, err1 := strconv.ParseUint(f[1], 16, 32)
			psn, err2 := strconv.ParseUint(f[2], 16, 32)
			g, err3 := hex.DecodeString(f[3])
			if err := errors.Join(err1, err2, err3); err != nil {
				return nil, err
			}
			ds[i] = dest{qpn: uint32(qpn), psn: uint32(psn)}
			copy(ds[i].gid[:], g)
		}
		return ds, nil
	}
	connectQPs := func(ds []dest) error {
		for i, qp := range qps { // every QP to the first message's GID
			if err := qp.Connect(ctx, vfrdma.Remote{QPN: ds[i].qpn, PSN: ds[i].psn, GID: ds[0].gid}, psns[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if peer != "" {
		var c net.Conn
		for {
			if c, err = net.Dial("tcp", peer); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return 0, 0, err
			case <-time.After(20 * time.Millisecond):
			}
		}
		defer c.Close()
		if _, err := c.Write(mine); err != nil {
			return 0, 0, err
		}
		ds, err := read(c)
		if err != nil {
			return 0, 0, err
		}
		if _, err := c.Write([]byte("done\x00")); err != nil {
			return 0, 0, err
		}
		c.Close()
		if err := connectQPs(ds); err != nil {
			return 0, 0, err
		}
	} else {
		c, err := ln.Accept()
		if err != nil {
			return 0, 0, err
		}
		defer c.Close()
		ds, err := read(c)
		if err != nil {
			return 0, 0, err
		}
		if err := connectQPs(ds); err != nil {
			return 0, 0, err
		}
		if _, err := c.Write(mine); err != nil {
			return 0, 0, err
		}
		done := make([]byte, 52)
		if n, err := c.Read(done); err != nil || string(done[:n]) != "done\x00" {
			return 0, 0, fmt.Errorf("the client's done: %q, %v", done[:n], err)
		}
	}

	// The traffic.
	send := func(i int) error {
		_, err := qps[i].PostSend([]vfrdma.SendWR{{WRID: sendWRID, SGEs: []vfrdma.SGE{mr.SGE(0, f.size)}}}, 0)
		return err
	}
	pending := make([]int, f.q)
	for i := range pending {
		pending[i] = recvWRID
		if peer != "" {
			if err := send(i); err != nil {
				return 0, 0, err
			}
			pending[i] = recvWRID | sendWRID
		}
	}
	wcs := make([]vfrdma.WC, f.q+f.rxDepth)
	for rcnt < f.iters || scnt < f.iters {
		n, err := perf.Spin.Next(ctx, cq, wcs)
		if err != nil {
			return rcnt, scnt, err
		}
		for _, wc := range wcs[:n] {
			if wc.Status != vfrdma.WCSuccess {
				return rcnt, scnt, fmt.Errorf("completion %+v", wc)
			}
			i := -1
			for k, qp := range qps {
				if qp.QPN() == wc.QPN {
					i = k
				}
			}
			if i < 0 {
				return rcnt, scnt, fmt.Errorf("a completion of QP %#x, none of its", wc.QPN)
			}
			switch wc.WRID {
			case sendWRID:
				scnt++
			case recvWRID:
				if routs--; routs <= f.q {
					if err := postRecvs(f.rxDepth - routs); err != nil {
						return rcnt, scnt, err
					}
					routs = f.rxDepth
				}
				rcnt++
			}
			pending[i] &^= int(wc.WRID)
			if scnt < f.iters && pending[i] == 0 {
				if err := send(i); err != nil {
					return rcnt, scnt, err
				}
				pending[i] = recvWRID | sendWRID
			}
		}
	}
	// What it received (the last message, or several at once) is what it
	// holds: pvctl sends zeros.
	if !bytes.Equal(mr.Bytes()[:f.size], make([]byte, f.size)) {
		return rcnt, scnt, errors.New("its buffer holds bytes other than zeros")
	}
	return rcnt, scnt, nil
}

// pvctl pingpong --srq --rdma-core runs against (a fake of)
// ibv_srq_pingpong, as the server and as the client, with the program's
// defaults of 500 receives at a time and as many QPs as pvctl, more QPs
// than round trips too: both finish, pvctl having checked every byte.
func TestSRQPingpongRDMACoreAgainstSrqPingpong(t *testing.T) {
	for _, tc := range []struct{ q, iters int }{{4, 200}, {16, 500}, {8, 5}} {
		for _, pvctlServer := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d QPs, %d iters, pvctl server %v", tc.q, tc.iters, pvctlServer), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				fab := pvsim.NewFabric()
				fake := &fakeSRQPingpong{q: tc.q, iters: tc.iters, size: 1024, rxDepth: 500, fab: fab}
				args := []string{"--rdma-core", "--srq", strconv.Itoa(tc.q), "--size", "1024", "--iters", strconv.Itoa(tc.iters), "--stall", "5s"}
				var ln net.Listener
				var addr string
				if pvctlServer {
					addr = freeAddr(t)
					args = append(args, "--listen", addr)
				} else {
					var err error
					ln, err = net.Listen("tcp", "127.0.0.1:0")
					require.NoError(t, err)
					defer ln.Close()
					args = append(args, "--connect", ln.Addr().String())
				}
				var out bytes.Buffer
				var pvErr error
				var wg sync.WaitGroup
				wg.Go(func() {
					pvErr = cmdPingpong(&env{out: &out, model: "v20", fabric: fab, json: true}, args)
				})
				rcnt, scnt, err := fake.run(ctx, ln, addr)
				wg.Wait()
				require.NoError(t, pvErr)
				require.NoError(t, err, "the fake ibv_srq_pingpong")
				assert.GreaterOrEqual(t, rcnt, tc.iters)
				assert.GreaterOrEqual(t, scnt, tc.iters)
				var r pingpongResult
				require.NoError(t, json.Unmarshal(out.Bytes(), &r), "%s", out.String())
				assert.Equal(t, pingpongResult{Transport: "RC", SRQQPs: tc.q, Size: 1024, Iters: tc.iters, Checked: true, Wait: "spin"}, stripTimes(withoutDoorbells(r)))
			})
		}
	}
}

// A count of QPs other than ibv_srq_pingpong's is refused, naming its -q.
func TestSRQPingpongRDMACoreCountMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fab := pvsim.NewFabric()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	fake := &fakeSRQPingpong{q: 2, iters: 10, size: 64, rxDepth: 500, fab: fab}
	done := make(chan error, 1)
	go func() { _, _, err := fake.run(ctx, ln, ""); done <- err }()
	err = cmdPingpong(&env{out: io.Discard, model: "v20", fabric: fab}, []string{"--rdma-core", "--srq", "4", "--size", "64", "--iters", "10", "--connect", ln.Addr().String()})
	assert.Error(t, <-done, "the fake's exchange ends without the client's done")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ibv_srq_pingpong has 2 QPs, this end 4: give its -q the number of --srq")
}

// Zeros pass; a byte other than 0 is named, the poison as nothing landed.
func TestCheckZeros(t *testing.T) {
	b := make([]byte, 5000)
	require.NoError(t, checkZeros(b, 3))
	b[4500] = 1
	assert.ErrorContains(t, checkZeros(b, 3), "message 3: byte 4500 is 0x1, want 0 (ibv_srq_pingpong's messages are zeros)")
	fillByte(b[10:20], srqPoison)
	assert.Equal(t, bytes.Repeat([]byte{srqPoison}, 10), b[10:20])
	assert.Zero(t, b[9])
	assert.Zero(t, b[20])
	assert.ErrorContains(t, checkZeros(b, 0), "byte 10 is 0xa5, want 0 (the slot's poison: nothing landed there)")
	require.NoError(t, checkZeros(nil, 0))
}
