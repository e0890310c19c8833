package vmxnet3

import (
	"context"
	"fmt"
)

// txRing is the transmit ring and its completion ring: one descriptor, one
// buffer and one completion per frame. Owned by the sender.
type txRing struct {
	desc, comp []byte // descriptors and completions, 16 bytes each
	bufs       []byte // size buffers of bufSize bytes
	bufIOVA    uint64
	bufSize    int
	size       uint32
	next       uint32 // the next descriptor to fill
	gen        uint32 // its generation: txGen or 0
	done       uint32 // the oldest descriptor not completed
	inFlight   int
	compNext   uint32
	compGen    uint32 // compGen or 0
	stats      []byte // the queue's device counters
}

func (t *txRing) init(mem []byte, iova uint64, l layout, size int) {
	*t = txRing{
		desc: mem[l.txRing : l.txRing+size*descSize], comp: mem[l.txComp : l.txComp+size*descSize],
		bufs: mem[l.txBufs : l.txBufs+size*l.bufSize], bufIOVA: iova + uint64(l.txBufs), bufSize: l.bufSize,
		size: uint32(size), gen: txGen, compGen: compGen,
	}
}

// reap takes the completions the device wrote. Each names the descriptor
// of the frame it completes, which must be the oldest in flight.
func (t *txRing) reap() error {
	for t.inFlight > 0 {
		c := t.comp[t.compNext*descSize : t.compNext*descSize+descSize]
		if atomicLoad32(c[12:])&compGen != t.compGen {
			return nil
		}
		if idx := le.Uint32(c[0:]) & txCompIdx; idx != t.done {
			return fmt.Errorf("%w: transmit completion %d names descriptor %d, want %d", ErrDeviceFault, t.compNext, idx, t.done)
		}
		t.done = (t.done + 1) % t.size
		t.inFlight--
		if t.compNext++; t.compNext == t.size {
			t.compNext, t.compGen = 0, t.compGen^compGen
		}
	}
	return nil
}

// put writes frame into the next descriptor's buffer and hands the
// descriptor to the device (generation last). Frames shorter than
// MinFrame are padded with zeros.
func (t *txRing) put(frame []byte) {
	i := t.next
	buf := t.bufs[int(i)*t.bufSize : int(i)*t.bufSize+t.bufSize]
	n := copy(buf, frame)
	if n < MinFrame {
		clear(buf[n:MinFrame])
		n = MinFrame
	}
	d := t.desc[i*descSize : i*descSize+descSize]
	le.PutUint64(d[0:], t.bufIOVA+uint64(i)*uint64(t.bufSize))
	le.PutUint32(d[12:], txEOP|txCQ) // one descriptor per frame, no offload
	atomicStore32(d[8:], uint32(n)&txLenMask|t.gen)
	if t.next++; t.next == t.size {
		t.next, t.gen = 0, t.gen^txGen
	}
	t.inFlight++
}

// Send transmits frames, in order, each from 14 to MaxFrame bytes (shorter
// than 60 are padded with zeros), with one doorbell for the batch. With the
// link down it sends nothing and returns ErrLinkDown (the device would
// drop the frames without a word). The
// frames are copied; the caller keeps them. It returns how many were sent:
// a frame of a bad size stops the batch with an error wrapping ErrFrameSize
// (the frames before it are sent), and a full ring with ErrRingFull. It
// does not allocate.
func (n *NIC) Send(frames [][]byte) (int, error) {
	if !n.txGate.Enter() {
		return 0, n.opErr("send", ErrClosed)
	}
	defer n.txGate.Exit()
	t := &n.tx
	if err := n.checkLink(); err != nil {
		return 0, n.opErr("send", err)
	}
	if err := t.reap(); err != nil {
		return 0, n.opErr("send", err)
	}
	sent, bytes := 0, 0
	var stop error
	for _, f := range frames {
		if len(f) < HeaderLen || len(f) > n.maxFrame {
			stop = fmt.Errorf("%w: frame %d is %d bytes: want %d to %d", ErrFrameSize, sent, len(f), HeaderLen, n.maxFrame)
			break
		}
		if t.inFlight == int(t.size) {
			stop = fmt.Errorf("%w: %d frames in flight", ErrRingFull, t.inFlight)
			break
		}
		t.put(f)
		sent++
		bytes += len(f)
	}
	if sent > 0 {
		// The value is the next descriptor to fill, as the hardware wants
		// it; QEMU reads the ring up to the first descriptor it does not
		// own and completes every frame before the write returns.
		if err := n.pt.Store32(regTXPROD, t.next); err != nil {
			return 0, n.opErr("send", err)
		}
		n.count.txDoorbells.Add(1)
		n.count.txFrames.Add(uint64(sent))
		n.count.txBytes.Add(uint64(bytes))
		if err := t.reap(); err != nil {
			return sent, n.opErr("send", err)
		}
	}
	if stop != nil {
		return sent, n.opErr("send", stop)
	}
	return sent, nil
}

// rxRing is receive ring 0 (one head buffer per frame) and the completion
// ring. Owned by the receiver.
type rxRing struct {
	desc, comp []byte
	bufs       []byte
	bufIOVA    uint64
	bufSize    int
	size       uint32 // ring 0's descriptors
	compSize   uint32
	fill       uint32 // the next descriptor to give back: the device fills in order
	fillGen    uint32 // the generation it gets: rxGen or 0
	compNext   uint32
	compGen    uint32
	stats      []byte
}

func (r *rxRing) init(mem []byte, iova uint64, l layout, size int) {
	*r = rxRing{
		desc: mem[l.rxRing0 : l.rxRing0+size*descSize], comp: mem[l.rxComp : l.rxComp+(size+ring1Size)*descSize],
		bufs: mem[l.rxBufs : l.rxBufs+size*l.bufSize], bufIOVA: iova + uint64(l.rxBufs), bufSize: l.bufSize,
		size: uint32(size), compSize: uint32(size + ring1Size), compGen: compGen,
	}
}

// postAll gives the device every buffer, generation 1 (its first lap);
// the next lap's descriptors carry 0.
func (r *rxRing) postAll() {
	for i := uint32(0); i < r.size; i++ {
		r.post(i, rxGen)
	}
	r.fill, r.fillGen = 0, 0
}

func (r *rxRing) post(i, gen uint32) {
	d := r.desc[i*descSize : i*descSize+descSize]
	le.PutUint64(d[0:], r.bufIOVA+uint64(i)*uint64(r.bufSize))
	le.PutUint32(d[12:], 0)
	atomicStore32(d[8:], uint32(r.bufSize)&rxLenMask|gen) // head buffer (btype 0), generation last
}

// Recv copies received frames into bufs, one each, and their lengths into
// sizes (which must be as long as bufs), without waiting: it returns how
// many it delivered, 0 when none is there. Each buffer given back to the
// device is reposted at once. A frame larger than its buffer in bufs stops
// the call with ErrShortBuffer and stays queued for the next call (give
// buffers of MaxFrame bytes). Frames the device truncated (larger than the
// MTU allows) are dropped and counted. It does not allocate.
func (n *NIC) Recv(bufs [][]byte, sizes []int) (int, error) {
	if len(sizes) < len(bufs) {
		return 0, n.opErr("receive", invalidf("%d sizes for %d buffers", len(sizes), len(bufs)))
	}
	if !n.rxGate.Enter() {
		return 0, n.opErr("receive", ErrClosed)
	}
	defer n.rxGate.Exit()
	return n.recv(bufs, sizes)
}

// recv is Recv inside the receive gate.
func (n *NIC) recv(bufs [][]byte, sizes []int) (int, error) {
	r := &n.rx
	got, bytes, trunc := 0, 0, 0
	var stop error
	for got < len(bufs) {
		c := r.comp[r.compNext*descSize : r.compNext*descSize+descSize]
		if atomicLoad32(c[12:])&compGen != r.compGen {
			break
		}
		w0, w2 := le.Uint32(c[0:]), le.Uint32(c[8:])
		idx, rq, length := w0&rxcIdxMask, (w0>>rxcRqShift)&rxcRqMask, int(w2&rxLenMask)
		// Every index the device wrote is checked: ring 0, the buffer due
		// next, one buffer per frame, no longer than the buffer.
		if rq != 0 || idx != r.fill || w0&(rxcSOP|rxcEOP) != rxcSOP|rxcEOP || length > r.bufSize {
			stop = fmt.Errorf("%w: receive completion %d (ring %d, descriptor %d, %d bytes, flags %#x): want ring 0, descriptor %d, one buffer of at most %d bytes",
				ErrDeviceFault, r.compNext, rq, idx, length, w0&(rxcSOP|rxcEOP), r.fill, r.bufSize)
			break
		}
		if w2&rxcErr == 0 {
			if length > len(bufs[got]) {
				stop = fmt.Errorf("%w: a %d-byte frame for a %d-byte buffer", ErrShortBuffer, length, len(bufs[got]))
				break
			}
			copy(bufs[got], r.bufs[int(idx)*r.bufSize:int(idx)*r.bufSize+length])
			sizes[got] = length
			got++
			bytes += length
		} else {
			trunc++
		}
		r.post(r.fill, r.fillGen)
		if r.fill++; r.fill == r.size {
			r.fill, r.fillGen = 0, r.fillGen^rxGen
		}
		if r.compNext++; r.compNext == r.compSize {
			r.compNext, r.compGen = 0, r.compGen^compGen
		}
	}
	if got > 0 || trunc > 0 {
		n.count.rxFrames.Add(uint64(got))
		n.count.rxBytes.Add(uint64(bytes))
		n.count.rxTrunc.Add(uint64(trunc))
	}
	if stop != nil {
		return got, n.opErr("receive", stop)
	}
	return got, nil
}

// RecvWait is Recv that waits, until ctx is done, for at least one frame:
// it sleeps on the receive interrupt, armed only while nothing is there
// (the vector masks itself when it fires), so a frame that lands between
// the last look and the sleep still wakes it.
func (n *NIC) RecvWait(ctx context.Context, bufs [][]byte, sizes []int) (int, error) {
	if n.rxGate.IsShut() {
		return 0, n.opErr("receive", ErrClosed)
	}
	if len(sizes) < len(bufs) {
		return 0, n.opErr("receive", invalidf("%d sizes for %d buffers", len(sizes), len(bufs)))
	}
	if n.rxIRQ == nil {
		return 0, n.opErr("receive", fmt.Errorf("%w: the NIC has no receive interrupt", ErrUnsupported))
	}
	for {
		got, err := n.armRecv(bufs, sizes)
		if got > 0 || err != nil {
			return got, err
		}
		n.count.rxWaits.Add(1)
		// The sleep is outside the gate: Close does not wait for it, it
		// wakes it (closing the vector).
		if _, err := n.rxIRQ.Wait(ctx); err != nil {
			return 0, n.opErr("receive", n.closedOr(&n.rxGate, err))
		}
	}
}

// armRecv receives what is there, and when nothing is, arms the receive
// interrupt and looks again, all inside the receive gate.
func (n *NIC) armRecv(bufs [][]byte, sizes []int) (int, error) {
	if !n.rxGate.Enter() {
		return 0, n.opErr("receive", ErrClosed)
	}
	defer n.rxGate.Exit()
	if got, err := n.recv(bufs, sizes); got > 0 || err != nil {
		return got, err
	}
	if _, err := n.rxIRQ.Poll(); err != nil { // forget wake-ups already seen
		return 0, n.opErr("receive", err)
	}
	if err := n.pt.Store32(regIMR+8*vecRx, 0); err != nil {
		return 0, n.opErr("unmask the receive interrupt", err)
	}
	return n.recv(bufs, sizes)
}
