package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/firmware"
)

// infoDoc is what `pvctl info --json` prints.
type infoDoc struct {
	BDF       string          `json:"bdf"`
	Version   uint32          `json:"version"`
	FWVer     string          `json:"fw_ver"`
	NodeGUID  string          `json:"node_guid"`
	GID       string          `json:"gid"`
	Caps      vfrdma.Caps     `json:"caps"`
	Port      vfrdma.PortAttr `json:"port"`
	Quirks    vfrdma.Quirks   `json:"quirks"`
	Recovered int             `json:"recovered_objects,omitempty"`
	SRQ       srqInfo         `json:"srq"`
}

// srqInfo is what matters to a user of shared receive queues.
type srqInfo struct {
	MaxSRQs int `json:"max_srqs"`
	// MaxSRQWR is the device's max_srq_wr.
	MaxSRQWR int `json:"max_srq_wr"`
	// MaxDepth is the largest SRQ the driver creates, by SGEs per receive
	// (index 0: 1 SGE), as the driver computes it (Device.MaxSRQDepth).
	MaxDepth []int `json:"max_depth_by_sge"`
	MaxSGE   int   `json:"max_sge"`
	// LimitEvents says who raises low-watermark events.
	LimitEvents string `json:"low_watermark_events"`
}

func newSRQInfo(d *vfrdma.Device) srqInfo {
	c := d.Caps()
	s := srqInfo{MaxSRQs: int(c.MaxSRQ), MaxSRQWR: int(c.MaxSRQWR), MaxSGE: int(c.MaxSRQSGE), LimitEvents: "the driver, from its own counts"}
	if d.Quirks().NoAsyncEvents {
		s.LimitEvents += " (the device sends none)"
	}
	for sge := 1; sge <= s.MaxSGE; sge++ {
		s.MaxDepth = append(s.MaxDepth, d.MaxSRQDepth(sge))
	}
	return s
}

// depthText lists MaxDepth by SGEs per receive, for the text output.
func (s *srqInfo) depthText() string {
	if len(s.MaxDepth) == 0 {
		return "none (no SRQ SGEs)"
	}
	parts := make([]string, len(s.MaxDepth))
	for i, n := range s.MaxDepth {
		parts[i] = fmt.Sprintf("%d (%d SGE)", n, i+1)
		if i > 0 {
			parts[i] = fmt.Sprintf("%d (%d SGEs)", n, i+1)
		}
	}
	return strings.Join(parts, ", ")
}

// limitText says what MaxDepth is made of, for the text output.
func (s *srqInfo) limitText() string {
	return fmt.Sprintf("the lower of max_srq_wr %d and what one ring of %d pages holds at each stride, rounded down to a power of two",
		s.MaxSRQWR, firmware.MaxRingChunks)
}

var portStates = []string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}

func mtuName(m uint32) string {
	if m >= 1 && m <= 5 {
		return fmt.Sprint(128 << m)
	}
	return fmt.Sprintf("unknown (%d)", m)
}

// cmdInfo opens the device and prints its capabilities and port, in the
// spirit of ibv_devinfo -v.
func cmdInfo(e *env, args []string) error {
	d, err := e.open(args, nil)
	if err != nil {
		return err
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	port, err := d.QueryPort(ctx)
	if err != nil {
		return err
	}
	c := d.Caps()
	doc := infoDoc{
		BDF: d.Name(), Version: d.Version(), FWVer: c.FWVersion(),
		NodeGUID: guid(c.NodeGUID), GID: d.GID().String(),
		Caps: c, Port: port, Quirks: d.Quirks(), Recovered: d.Recovered(),
		SRQ: newSRQInfo(d),
	}
	if err := d.Close(); err != nil {
		return err
	}
	if e.json {
		return e.printJSON(doc)
	}
	printInfo(e.out, &doc)
	return nil
}

func guid(v uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", v>>48, v>>32&0xffff, v>>16&0xffff, v&0xffff)
}

func printInfo(w io.Writer, d *infoDoc) {
	c, p := &d.Caps, &d.Port
	state := fmt.Sprint(p.State)
	if int(p.State) < len(portStates) {
		state = portStates[p.State]
	}
	rows := []struct {
		k string
		v any
	}{
		{"hca_id", "pvrdma " + d.BDF},
		{"interface version", d.Version},
		{"fw_ver", d.FWVer},
		{"node_guid", d.NodeGUID},
		{"sys_image_guid", guid(c.SysImageGUID)},
		{"phys_port_cnt", c.PhysPortCnt},
		{"max_mr_size", fmt.Sprintf("0x%x", c.MaxMRSize)},
		{"max_qp", c.MaxQP},
		{"max_qp_wr", c.MaxQPWR},
		{"max_sge", c.MaxSGE},
		{"max_cq", c.MaxCQ},
		{"max_cqe", c.MaxCQE},
		{"max_mr", c.MaxMR},
		{"max_pd", c.MaxPD},
		{"max_ah", c.MaxAH},
		{"max_srq", c.MaxSRQ},
		{"max_srq_wr", c.MaxSRQWR},
		{"max_srq_sge", c.MaxSRQSGE},
		{"max_pkeys", c.MaxPKeys},
		{"gid_tbl_len", c.GIDTblLen},
		{"gid_types", fmt.Sprintf("0x%x", c.GIDTypes)},
		{"mode", map[uint8]string{0: "RoCE", 1: "iWARP", 2: "InfiniBand"}[c.Mode]},
		{"port 1 state", state},
		{"port 1 max_mtu", mtuName(p.MaxMTU)},
		{"port 1 active_mtu", mtuName(p.ActiveMTU)},
		{"port 1 max_msg_sz", fmt.Sprintf("0x%x", p.MaxMsgSz)},
		{"port 1 gid_tbl_len", p.GIDTblLen},
		{"port 1 pkey_tbl_len", p.PKeyTblLen},
		{"port 1 active_width", p.ActiveWidth},
		{"port 1 active_speed", p.ActiveSpeed},
		{"port 1 GID[0]", d.GID},
		{"srq max_srqs", d.SRQ.MaxSRQs},
		{"srq max_sge", fmt.Sprintf("%d per receive", d.SRQ.MaxSGE)},
		{"srq max depth", d.SRQ.depthText()},
		{"srq depth limit", d.SRQ.limitText()},
		{"srq low watermark", "raised by " + d.SRQ.LimitEvents},
		{"quirks", fmt.Sprintf("emulated=%v cq_arm_both=%v no_async_events=%v", d.Quirks.Emulated, d.Quirks.CQArmBoth, d.Quirks.NoAsyncEvents)},
	}
	for _, r := range rows {
		fmt.Fprintf(w, "%-22s %v\n", r.k+":", r.v)
	}
	if d.Recovered > 0 {
		fmt.Fprintf(w, "%-22s %d (left by a process that died holding the device)\n", "recovered objects:", d.Recovered)
	}
}
