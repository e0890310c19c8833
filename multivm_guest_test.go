//go:build guest

package vfrdma

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/vfrdma/vfrdma/qemu/guestctl"
	"github.com/vfrdma/vfrdma/qemu/proto"
)

type vmPeer struct {
	c        *guestctl.Conn
	vm, peer int
}

func (p *vmPeer) swap(t *testing.T, key string, mine any, theirs any) {
	t.Helper()
	b, _ := json.Marshal(mine)
	if err := p.c.Put(fmt.Sprintf("%s/%d", key, p.vm), string(b)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := p.c.Get(ctx, fmt.Sprintf("%s/%d", key, p.peer))
	if err != nil {
		t.Fatalf("waiting for vm%d's %s: %v", p.peer, key, err)
	}
	if err := json.Unmarshal([]byte(s), theirs); err != nil {
		t.Fatal(err)
	}
}

func (p *vmPeer) barrier(t *testing.T, name string) {
	t.Helper()
	var ok bool
	p.swap(t, "barrier/"+name, true, &ok)
}

type vmAddr struct {
	QPN uint32
	GID GID
}

// Traffic between two VMs on the shared fabric: RC and UD in both
// directions at once, every byte checked, every request completed once.
func TestMultiVMTraffic(t *testing.T) {
	bdf := guestBDF(t)
	vm, err1 := strconv.Atoi(os.Getenv(proto.EnvVM))
	vms, err2 := strconv.Atoi(os.Getenv(proto.EnvVMs))
	if err1 != nil || err2 != nil || vms < 2 {
		t.Fatalf("this test needs a two-VM run (pvvm -vms 2); %s=%q %s=%q", proto.EnvVM, os.Getenv(proto.EnvVM), proto.EnvVMs, os.Getenv(proto.EnvVMs))
	}
	if vm > 1 {
		return // VMs past the first two have no peer here
	}
	d, err := Open(bdf, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := guestctl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := &vmPeer{c: c, vm: vm, peer: 1 - vm}

	for _, typ := range []QPType{RC, UD} {
		t.Run(typ.String(), func(t *testing.T) {
			depth, slot := 64, 64<<10
			if typ == UD {
				slot = d.UDMaxPayload() + UDHeaderRoom
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			pd, err := d.AllocPD(ctx)
			if err != nil {
				t.Fatal(err)
			}
			cq, err := d.CreateCQ(ctx, 4*depth)
			if err != nil {
				t.Fatal(err)
			}
			qp, err := pd.CreateQP(ctx, &QPConfig{Type: typ, SendCQ: cq, RecvCQ: cq, SendDepth: depth, RecvDepth: depth, QKey: 0x2222})
			if err != nil {
				t.Fatal(err)
			}
			smr, err := pd.AllocMR(ctx, depth*slot, AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			rmr, err := pd.AllocMR(ctx, depth*slot, AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			var them vmAddr
			p.swap(t, "traffic/"+typ.String(), vmAddr{QPN: qp.QPN(), GID: d.GID()}, &them)
			if them.GID == d.GID() {
				t.Fatalf("both VMs have GID %s: the VMs' MACs must differ", them.GID)
			}
			var ah *AH
			if typ == RC {
				err = qp.Connect(ctx, Remote{QPN: them.QPN, GID: them.GID}, 0)
			} else {
				err = qp.Connect(ctx, Remote{}, 0)
				if err == nil {
					ah, err = pd.CreateAH(AHAttr{DGID: them.GID})
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			hdr := 0
			sizes := rcSizes(slot)
			if typ == UD {
				hdr = UDHeaderRoom
				sizes = []int{0, 1, 40, 100, 1000, 1024, 2048, d.UDMaxPayload()}
			}
			postRecv := func(s int) {
				if _, err := qp.PostRecv([]RecvWR{{WRID: uint64(s), SGEs: []SGE{rmr.SGE(s*slot, slot)}}}, 0); err != nil {
					t.Fatal(err)
				}
			}
			for s := 0; s < depth; s++ {
				postRecv(s)
			}
			p.barrier(t, "posted-"+typ.String())

			// Messages carry their sequence number in their pattern:
			// vm*1e6+seq. pump sends up to sendTo and reaps until every
			// send up to sendTo completed and recvTo messages arrived.
			swr := make([]SendWR, 16)
			sge := make([]SGE, 16)
			wcs := make([]WC, 64)
			sent, sendDone, recvd := 0, 0, 0
			pump := func(sendTo, recvTo int) {
				for sent < sendTo || sendDone < sendTo || recvd < recvTo {
					if n := min(16, sendTo-sent, depth-(sent-sendDone)); n > 0 {
						for i := 0; i < n; i++ {
							seq := sent + i
							size := sizes[seq%len(sizes)]
							s := seq % depth
							fill(smr.Bytes()[s*slot:s*slot+size], vm*1000000+seq)
							sge[i] = smr.SGE(s*slot, size)
							swr[i] = SendWR{WRID: uint64(seq), SGEs: sge[i : i+1], AH: ah, RemoteQPN: them.QPN, RemoteQKey: 0x2222}
							if size == 0 {
								swr[i].SGEs = nil
							}
						}
						if _, err := qp.PostSend(swr[:n], 0); err != nil {
							t.Fatal(err)
						}
						sent += n
					}
					k, err := cq.Poll(wcs)
					if err != nil {
						t.Fatal(err)
					}
					if k == 0 {
						wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
						err := cq.Wait(wctx)
						cancel()
						if err != nil {
							t.Fatalf("stalled: sent %d, done %d, received %d of %d: %v", sent, sendDone, recvd, recvTo, err)
						}
						continue
					}
					for _, wc := range wcs[:k] {
						if wc.Status != WCSuccess {
							t.Fatalf("completion %+v", wc)
						}
						if wc.Opcode == WCSend {
							if wc.WRID != uint64(sendDone) {
								t.Fatalf("send completion for wr_id %d, want %d", wc.WRID, sendDone)
							}
							sendDone++
							continue
						}
						seq := recvd
						size := sizes[seq%len(sizes)]
						s := int(wc.WRID)
						if s != seq%depth || int(wc.ByteLen) != size+hdr {
							t.Fatalf("receive %+v for message %d: want slot %d, %d bytes", wc, seq, seq%depth, size+hdr)
						}
						if err := check(rmr.Bytes()[s*slot+hdr:s*slot+hdr+size], p.peer*1000000+seq); err != nil {
							t.Fatal(err)
						}
						recvd++
						postRecv(s)
					}
				}
			}
			total := 50000
			start := time.Now()
			if typ == RC {
				// RC needs no pacing: a send waits for the peer's receive.
				pump(total, total)
			} else {
				// UD drops a datagram that finds no receive posted: rounds of
				// one queue's worth, each after both ends reposted all.
				total = 100 * depth
				for r := 1; r*depth <= total; r++ {
					p.barrier(t, fmt.Sprintf("ud-round-%d", r))
					pump(r*depth, r*depth)
				}
			}
			el := time.Since(start)
			st, _ := qp.DoorbellStats()
			t.Logf("%v vm%d<->vm%d: %d messages each way in %v (%.0f msg/s each way), %.3f send doorbells per message",
				typ, vm, p.peer, total, el, float64(total)/el.Seconds(), float64(st.Doorbells)/float64(total))
			p.barrier(t, "done-"+typ.String())
		})
	}
}
