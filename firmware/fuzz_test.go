package firmware

import (
	"context"
	"errors"
	"testing"
)

// Everything the device writes is fuzzed: command responses (with the ERR
// value), the capabilities, and the ring producer indices and elements. No
// input may panic, and every error must be typed.

// allResponses returns a fresh decoder for every command with a payload.
func allResponses() []Response {
	return []Response{&QueryPortResponse{}, &QueryPKeyResponse{}, &CreatePDResponse{}, &CreateMRResponse{},
		&CreateCQResponse{}, &ResizeCQResponse{}, &CreateQPResponse{}, &CreateQPResponse{V2: true},
		&QueryQPResponse{}, &DestroyQPResponse{}, &CreateUCResponse{}, &CreateSRQResponse{},
		&QuerySRQResponse{}, HeaderOnly{}}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(make([]byte, RespSlotSize))
	f.Add(resp(1, 0x80000009, 0, func(b []byte) { p32(b, 16, 0xFFFFFFFF) }))
	f.Add(resp(1, 0x8000000B, 0, func(b []byte) { p32(b, 16, 9) }))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, r := range allResponses() {
			if err := r.Decode(b); err != nil && !errors.Is(err, ErrDeviceFault) && !errors.Is(err, ErrInvalid) {
				t.Fatalf("%T: untyped error %v", r, err)
			}
		}
		_ = CheckResponse(b, 1, 0x80000000)
	})
}

// scriptedRegs is a device that answers every REQUEST with given bytes and
// ERR, whatever the command.
type scriptedRegs struct {
	resp   []byte
	answer []byte
	err    uint32
	cookie bool // stamp the request's cookie over the answer
	cmd    []byte
}

func (s *scriptedRegs) Load32(off int) (uint32, error) {
	if off == RegErr {
		return s.err, nil
	}
	return 0, nil
}

func (s *scriptedRegs) Store32(off int, v uint32) error {
	if off == RegRequest {
		copy(s.resp, s.answer)
		if s.cookie {
			copy(s.resp[0:8], s.cmd[0:8])
		}
	}
	return nil
}

func FuzzChannelResponse(f *testing.F) {
	f.Add(make([]byte, RespSlotSize), uint32(0), true)
	f.Add(resp(0, 0x80000002, 0, nil), uint32(0), true)
	f.Add(resp(0, 0x80000013, 0, nil), uint32(0), true)
	f.Add(resp(0, 0x80000009, 0, func(b []byte) { p32(b, 16, 0x1000000) }), uint32(0), true)
	f.Add([]byte{}, uint32(0xFFFF), false)
	f.Add([]byte{}, uint32(0xFFFFFFEA), false)
	f.Fuzz(func(t *testing.T, answer []byte, errReg uint32, cookie bool) {
		cmd, rs := make([]byte, CmdSlotSize), make([]byte, RespSlotSize)
		dev := &scriptedRegs{resp: rs, answer: answer, err: errReg, cookie: cookie, cmd: cmd}
		ch, err := NewChannel(dev, cmd, rs, nil)
		if err != nil {
			t.Fatal(err)
		}
		ch.loaded = true
		ctx := context.Background()
		check := func(what string, err error) {
			if err == nil {
				return
			}
			var oe *OpError
			if !errors.As(err, &oe) {
				t.Fatalf("%s: not an *OpError: %v", what, err)
			}
			if oe.Status == 0 && oe.Err == nil {
				t.Fatalf("%s: empty error", what)
			}
		}
		_, err = ch.QueryPort(ctx, 1)
		check("QueryPort", err)
		_, err = ch.CreatePD(ctx, 0)
		check("CreatePD", err)
		_, err = ch.CreateQP(ctx, CreateQPRequest{PDirDMA: 0x1000, MaxSendWR: 1, MaxRecvWR: 1, SendChunks: 1, TotalChunks: 3})
		check("CreateQP", err)
		_, err = ch.QueryQP(ctx, 1, 0)
		check("QueryQP", err)
		check("ModifyQP", ch.ModifyQP(ctx, ModifyQPRequest{}))
		_, err = ch.QuerySRQ(ctx, 0)
		check("QuerySRQ", err)
		check("ModifySRQ", ch.ModifySRQ(ctx, ModifySRQRequest{AttrMask: SRQAttrLimit, Attr: SRQAttr{SRQLimit: 1}}))
		check("DestroyCQ", ch.DestroyCQ(ctx, 0))
	})
}

func FuzzCaps(f *testing.F) {
	f.Add(make([]byte, CapsSize), uint32(17))
	f.Add(capsBytes()[CapsOffset:], uint32(18))
	f.Fuzz(func(t *testing.T, caps []byte, version uint32) {
		dsr := make([]byte, DSRSize)
		copy(dsr[CapsOffset:], caps)
		c, err := DecodeCaps(dsr)
		if err != nil {
			if !errors.Is(err, ErrDSRNotLoaded) {
				t.Fatalf("decode: %v", err)
			}
			return
		}
		if err := c.Validate(version); err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || !(errors.Is(err, ErrNotSupported) || errors.Is(err, ErrDeviceFault)) {
				t.Fatalf("validate: %v", err)
			}
		}
		_ = QuirksFor(version, &c)
		_ = c.FWVersion()
	})
}

func FuzzDeviceRing(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 5, 0, 0, 0}, []byte{1, 2, 3, 4})
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF, 1, 8, 0, 0}, []byte{0xFF, 0xFF, 0xFF, 0xFF})
	f.Fuzz(func(t *testing.T, tails []byte, fill []byte) {
		tr := newTestRing(t, 1)
		c, err := NewCQNotifyRing(tr.regs, tr.data)
		if err != nil {
			t.Fatal(err)
		}
		ta := newTestRing(t, 1)
		a, err := NewAsyncRing(ta.regs, ta.data)
		if err != nil {
			t.Fatal(err)
		}
		if len(fill) > 0 {
			for i := range tr.data[0] {
				tr.data[0][i] = fill[i%len(fill)]
				ta.data[0][i] = fill[i%len(fill)]
			}
		}
		cqs := make([]uint32, 300)
		evs := make([]AsyncEvent, 300)
		for len(tails) >= 4 {
			v := le.Uint32(tails)
			tails = tails[4:]
			tr.setTail(v)
			ta.setTail(v)
			n, err := c.Poll(cqs)
			if err != nil && !errors.Is(err, ErrDeviceFault) {
				t.Fatalf("CQ ring: %v", err)
			}
			if n < 0 || n > len(cqs) || tr.head() >= 2*uint32(c.Slots()) {
				t.Fatalf("CQ ring: n %d head %d", n, tr.head())
			}
			for _, h := range cqs[:n] {
				if h > HandleMask {
					t.Fatalf("handle %#x returned", h)
				}
			}
			n, err = a.Poll(evs)
			if err != nil && !errors.Is(err, ErrDeviceFault) {
				t.Fatalf("async ring: %v", err)
			}
			if n < 0 || n > len(evs) || ta.head() >= 2*uint32(a.Slots()) {
				t.Fatalf("async ring: n %d head %d", n, ta.head())
			}
		}
	})
}
