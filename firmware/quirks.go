package firmware

import "context"

// This file gathers, in one place, where QEMU 7.2's emulation of the device
// differs from the device interface, and how the driver finds out.

// CQ doorbell bits (UAR page offset 0x4; the handle in bits 23..0).
const (
	DoorbellCQArmSol uint32 = 1 << 29 // arm for solicited completions
	DoorbellCQArm    uint32 = 1 << 30 // arm for the next completion
	DoorbellCQPoll   uint32 = 1 << 31 // QEMU: poll the backend CQ now
)

// SRQSwap says whether the device swaps MODIFY_SRQ and QUERY_SRQ.
type SRQSwap uint8

// SRQSwap values.
const (
	// SRQSwapUnknown: not probed yet.
	SRQSwapUnknown SRQSwap = iota
	// SRQSwapNo: the codes mean what the interface says.
	SRQSwapNo
	// SRQSwapYes: QEMU 7.2 (and every QEMU with the device, 4.1 on): its
	// handler table lists QUERY_SRQ before MODIFY_SRQ, so code 18 runs the
	// query (acknowledged 0x80000013) and code 19 runs the modify
	// (acknowledged 0x80000012).
	SRQSwapYes
)

// MarshalText names the state in JSON.
func (s SRQSwap) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s SRQSwap) String() string {
	switch s {
	case SRQSwapNo:
		return "no"
	case SRQSwapYes:
		return "yes"
	}
	return "unknown"
}

// Quirks are the deviations from the device interface the rest of the
// driver consults. Channel.LoadDSR sets them from the version and the
// capabilities; the SRQ probe (Channel.ProbeSRQSwap, run by the first
// ModifySRQ or QuerySRQ) settles SRQSwap and confirms Emulated.
type Quirks struct {
	// Version is the device interface version (the VERSION register).
	Version uint32 `json:"version"`
	// Emulated reports QEMU's emulation: its capabilities leave zero the
	// fields a real device fills (vendor_id, vendor_part_id, hw_ver,
	// page_size_cap), or the SRQ probe found its swapped SRQ commands.
	Emulated bool `json:"emulated"`
	// SRQSwap says whether MODIFY_SRQ and QUERY_SRQ are swapped. It is
	// detected, never assumed from Emulated.
	SRQSwap SRQSwap `json:"srq_swap"`
	// NoAsyncEvents: the device never writes the async-event ring nor
	// raises vector 1 (QEMU 7.2): no SRQ-limit, QP-fatal or port events;
	// errors show up only as error CQEs. Derive SRQ low-watermark signals
	// from the driver's own counts.
	NoAsyncEvents bool `json:"no_async_events"`
	// CQArmBoth: the CQ doorbell arms for the next completion only with
	// ARM and ARM_SOL together; ARM alone disarms (QEMU 7.2). See CQArm.
	CQArmBoth bool `json:"cq_arm_both"`
	// UnquiesceKeepsErr: CTL UNQUIESCE does nothing and leaves ERR as the
	// last command left it (QEMU 7.2), so ERR says nothing about it.
	UnquiesceKeepsErr bool `json:"unquiesce_keeps_err"`
}

// QuirksFor returns the quirks a device reporting version and caps is
// known to have before any probing.
func QuirksFor(version uint32, caps *Caps) Quirks {
	q := Quirks{Version: version}
	if caps.VendorID == 0 && caps.VendorPartID == 0 && caps.HWVer == 0 && caps.PageSizeCap == 0 {
		q.setEmulated()
	}
	return q
}

func (q *Quirks) setEmulated() {
	q.Emulated = true
	q.NoAsyncEvents = true
	q.CQArmBoth = true
	q.UnquiesceKeepsErr = true
}

// CreateQPV2 reports whether CREATE_QP responses use the v2 layout (a QP
// handle separate from the QPN): devices reporting VERSION >= 20. QEMU 7.2
// reports 17 and writes v1.
func (q Quirks) CreateQPV2() bool { return q.Version >= VersionQPHandle }

// PFN64 reports whether UAR PFNs (DSR uar_pfn, CREATE_UC pfn) are 64-bit:
// VERSION >= 19.
func (q Quirks) PFN64() bool { return q.Version >= VersionPPN64 }

// CQArm returns the doorbell bits that arm a CQ (OR in the CQ handle and
// write at UAR offset 0x4): ARM for the next completion or ARM_SOL for the
// next solicited one, as the interface defines; with CQArmBoth, ARM|ARM_SOL
// either way, which on QEMU 7.2 arms for the next completion of any kind
// (it has no solicited-only filtering, so a solicited-only waiter may wake
// early and must re-check).
func (q Quirks) CQArm(solicitedOnly bool) uint32 {
	switch {
	case q.CQArmBoth:
		return DoorbellCQArm | DoorbellCQArmSol
	case solicitedOnly:
		return DoorbellCQArmSol
	}
	return DoorbellCQArm
}

// srqProbe is code 18 laid out so that both readings of it are harmless: a
// MODIFY_SRQ of the SRQ with attr_mask 0 (changes nothing) on a device that
// follows the interface, a QUERY_SRQ of the SRQ on QEMU (srq_handle is at
// offset 16 in both layouts).
type srqProbe struct{ handle uint32 }

func (srqProbe) Cmd() Cmd { return CmdModifySRQ }

func (p srqProbe) Encode(b []byte) error {
	if err := beginRequest(b, CmdModifySRQ); err != nil {
		return err
	}
	le.PutUint32(b[16:], p.handle)
	return nil
}

// swappedQuerySRQ is a query on a device with SRQSwapYes: code 18, query
// layout, acknowledged as QUERY_SRQ.
type swappedQuerySRQ struct{ handle uint32 }

func (swappedQuerySRQ) Cmd() Cmd    { return CmdModifySRQ }
func (swappedQuerySRQ) ack() uint32 { return CmdQuerySRQ.Ack() }
func (swappedQuerySRQ) op() string  { return "QUERY_SRQ (sent as code 18, QEMU swap)" }

func (q swappedQuerySRQ) Encode(b []byte) error {
	return QuerySRQRequest{SRQHandle: q.handle}.encodeAs(b, CmdModifySRQ)
}

// swappedModifySRQ is a modify on a device with SRQSwapYes: code 19, modify
// layout, acknowledged as MODIFY_SRQ.
type swappedModifySRQ struct{ r ModifySRQRequest }

func (swappedModifySRQ) Cmd() Cmd    { return CmdQuerySRQ }
func (swappedModifySRQ) ack() uint32 { return CmdModifySRQ.Ack() }
func (swappedModifySRQ) op() string  { return "MODIFY_SRQ (sent as code 19, QEMU swap)" }

func (m swappedModifySRQ) Encode(b []byte) error {
	if err := beginRequest(b, CmdQuerySRQ); err != nil {
		return err
	}
	m.r.encodeBody(b)
	return nil
}

// ProbeSRQSwap finds out whether the device swaps MODIFY_SRQ and QUERY_SRQ,
// once per channel (the answer is cached in Quirks). It sends code 18 with
// srqHandle and an empty attribute mask: a device that follows the interface
// runs a MODIFY_SRQ that changes nothing (or rejects it), QEMU runs a query
// and acknowledges it 0x80000013, whether or not the handle exists. Use the
// handle of an SRQ you own. The answer comes from the response slot read
// right after ERR; QEMU executes commands synchronously, so a device that
// answers later is, correctly, not taken for QEMU.
func (c *Channel) ProbeSRQSwap(ctx context.Context, srqHandle uint32) (SRQSwap, error) {
	if err := c.lock(ctx, "probe SRQ swap"); err != nil {
		return SRQSwapUnknown, err
	}
	defer c.unlock()
	s, _, err := c.probeSRQ(srqHandle)
	return s, err
}

// probeResult is what the probe learnt beyond the swap: on a swapping device
// the probe was a query, and these are its outcome.
type probeResult struct {
	status Status  // ERR
	err    error   // the status's error, or a bad response
	attr   SRQAttr // valid if err is nil
}

func (c *Channel) probeSRQ(h uint32) (SRQSwap, probeResult, error) {
	if s := c.Quirks().SRQSwap; s != SRQSwapUnknown {
		return s, probeResult{}, nil
	}
	cookie, st, err := c.post("probe SRQ swap", srqProbe{handle: h})
	if err != nil {
		return SRQSwapUnknown, probeResult{}, err
	}
	// QEMU writes the response header even when the command fails.
	hdr, _ := DecodeRespHeader(c.resp)
	if hdr.Cookie != cookie || hdr.Ack != CmdQuerySRQ.Ack() {
		c.setQuirks(func(q *Quirks) { q.SRQSwap = SRQSwapNo })
		return SRQSwapNo, probeResult{}, nil
	}
	c.setQuirks(func(q *Quirks) {
		q.SRQSwap = SRQSwapYes
		q.setEmulated()
	})
	res := probeResult{status: st}
	if st != 0 {
		res.err = st.err()
		return SRQSwapYes, res, nil
	}
	if err := CheckResponse(c.resp, cookie, CmdQuerySRQ.Ack()); err != nil {
		res.err = err
		return SRQSwapYes, res, nil
	}
	var r QuerySRQResponse
	res.err = r.Decode(c.resp)
	res.attr = r.Attr
	return SRQSwapYes, res, nil
}

// QuerySRQ queries an SRQ with the code the device needs: on a device that
// swaps the SRQ commands, code 18 (the first call may be the probe itself,
// whose answer is the query's).
func (c *Channel) QuerySRQ(ctx context.Context, srqHandle uint32) (SRQAttr, error) {
	const op = "QUERY_SRQ"
	if err := c.lock(ctx, op); err != nil {
		return SRQAttr{}, err
	}
	defer c.unlock()
	wasUnknown := c.Quirks().SRQSwap == SRQSwapUnknown
	s, res, err := c.probeSRQ(srqHandle)
	if err != nil {
		return SRQAttr{}, err
	}
	if s == SRQSwapYes && wasUnknown {
		if res.err != nil {
			return SRQAttr{}, c.opErr(op, res.status, res.err)
		}
		return res.attr, nil
	}
	var resp QuerySRQResponse
	var req Request = QuerySRQRequest{SRQHandle: srqHandle}
	if s == SRQSwapYes {
		req = swappedQuerySRQ{handle: srqHandle}
	}
	if err := c.exec(ctx, req, &resp); err != nil {
		return SRQAttr{}, err
	}
	return resp.Attr, nil
}

// ModifySRQ modifies an SRQ with the code the device needs: on a device
// that swaps the SRQ commands, code 19 in the MODIFY_SRQ layout (QEMU then
// accepts only AttrMask == SRQAttrLimit with a non-zero limit). Sending
// code 18 there would run a query and report success without modifying
// anything, which is what Linux's driver does.
func (c *Channel) ModifySRQ(ctx context.Context, req ModifySRQRequest) error {
	if err := c.lock(ctx, "MODIFY_SRQ"); err != nil {
		return err
	}
	defer c.unlock()
	s, _, err := c.probeSRQ(req.SRQHandle)
	if err != nil {
		return err
	}
	if s == SRQSwapYes {
		return c.exec(ctx, swappedModifySRQ{r: req}, HeaderOnly{})
	}
	return c.exec(ctx, req, HeaderOnly{})
}
