package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/firmware"
)

// infoAbout is info's help beyond its summary: the JSON's forms.
const infoAbout = `With --json, one object: bdf, vfio (the path the device was taken
through: "cdev" or "group", "none (the model)" on --model),
interface_version and transport; then
every capability the device reported, under ibv_devinfo -v's names where
it prints one (fw_ver, node_guid, vendor_part_id, max_qp_wr,
max_map_per_fmr, ..., with atomic_cap beside atomic_ops) and the
capabilities' own names for the others (the device's gid_tbl_len is
max_gid_tbl_len); then "ports" (per port: state, max_mtu, active_mtu,
link_layer, ..., gids), "quirks" and "srq". GUIDs are strings in
ibv_devinfo's form "xxxx:xxxx:xxxx:xxxx"; 64-bit values (max_mr_size,
page_size_cap, atomic_arg_sizes) are "0x..." strings, as ibv_devinfo
prints them; other numbers are numbers; enumerations are the names
ibv_devinfo prints without its "(code)": "PORT_ACTIVE", "1024",
"Ethernet", "1X", "2.5 Gbps", "LINK_UP", "ATOMIC_HCA", and "unknown (N)"
for a code it has no name for.`

// infoDoc is what `pvctl info` shows (infoAbout says the JSON's forms).
// Its JSON holds the firmware structs' fields under their JSON tags, in
// their order, through the views below: a new field of firmware.Caps,
// PortAttr or Quirks shows up without a change here.
type infoDoc struct {
	bdf       string
	vfio      string // the VFIO path taken: "cdev", "group", "" on the model
	version   uint32 // the VERSION register
	caps      firmware.Caps
	port      firmware.PortAttr
	gids      []string // by index: the one the driver binds, index 0
	quirks    firmware.Quirks
	srq       srqInfo
	recovered int
}

// A view says how info shows a firmware field, by its JSON tag: under
// another key (ibv_devinfo's name, or one that keeps keys unique), in
// another form, or not at all. A field without a view is shown as it is,
// under its tag.
type view struct {
	key  string                  // "" for the tag; "-" to leave the field out
	form func(reflect.Value) any // nil for the value as it is
}

// capsViews are the capabilities shown other than as they are.
var capsViews = map[string]view{
	"fw_ver":           {form: func(v reflect.Value) any { return (&firmware.Caps{FWVer: v.Uint()}).FWVersion() }},
	"node_guid":        {form: func(v reflect.Value) any { return guid(v.Uint()) }},
	"sys_image_guid":   {form: func(v reflect.Value) any { return guid(v.Uint()) }},
	"max_mr_size":      {form: func(v reflect.Value) any { return hex64(v.Uint()) }},
	"page_size_cap":    {form: func(v reflect.Value) any { return hex64(v.Uint()) }},
	"atomic_arg_sizes": {form: func(v reflect.Value) any { return hex64(v.Uint()) }},
	"gid_tbl_len":      {key: "max_gid_tbl_len"}, // the port's is gid_tbl_len
	"gid_types":        {form: func(v reflect.Value) any { return gidTypeNames(uint8(v.Uint())) }},
	"mode":             {key: "-"}, // shown as transport and link_layer
}

// portViews are the port attributes shown other than as they are.
var portViews = map[string]view{
	"state":        {form: func(v reflect.Value) any { return portStateName(uint32(v.Uint())) }},
	"max_mtu":      {form: func(v reflect.Value) any { return enumName(mtuNames, uint32(v.Uint())) }},
	"active_mtu":   {form: func(v reflect.Value) any { return enumName(mtuNames, uint32(v.Uint())) }},
	"lid":          {key: "port_lid"},
	"lmc":          {key: "port_lmc"},
	"max_vl_num":   {form: func(v reflect.Value) any { return enumName(vlNames, uint32(v.Uint())) }},
	"active_width": {form: func(v reflect.Value) any { return enumName(widthNames, uint32(v.Uint())) }},
	"active_speed": {form: func(v reflect.Value) any { return enumName(speedNames, uint32(v.Uint())) }},
	"phys_state":   {form: func(v reflect.Value) any { return enumName(physStateNames, uint32(v.Uint())) }},
}

// quirksViews: the version is interface_version.
var quirksViews = map[string]view{"version": {key: "-"}}

// object is a JSON object whose members keep the order they were added in.
type object []member

type member struct {
	key   string
	value any
}

func (o *object) add(key string, value any) { *o = append(*o, member{key, value}) }

// MarshalJSON writes the members in order; a key twice is an error.
func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	seen := make(map[string]bool, len(o))
	for i, m := range o {
		if seen[m.key] {
			return nil, fmt.Errorf("key %q twice in one object", m.key)
		}
		seen[m.key] = true
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(m.key)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(m.value)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.key, err)
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// addFields adds the fields of s, a struct, under their JSON tags, in
// their order, each through its view. after, if it names a key, is called
// once that key is added.
func (o *object) addFields(s any, views map[string]view, after map[string]func()) {
	v := reflect.ValueOf(s)
	for i := range v.NumField() {
		f := v.Type().Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || tag == "" || tag == "-" {
			continue
		}
		key, value := tag, v.Field(i).Interface()
		if vw, ok := views[tag]; ok {
			if vw.key == "-" {
				continue
			}
			if vw.key != "" {
				key = vw.key
			}
			if vw.form != nil {
				value = vw.form(v.Field(i))
			}
		}
		o.add(key, value)
		if fn := after[key]; fn != nil {
			fn()
		}
	}
}

// MarshalJSON writes the document infoAbout describes.
func (d *infoDoc) MarshalJSON() ([]byte, error) {
	transport, link := transportAndLink(d.caps.Mode)
	var doc object
	doc.add("bdf", d.bdf)
	doc.add("vfio", vfioText(d.vfio))
	doc.add("interface_version", d.version)
	doc.add("transport", transport)
	doc.addFields(d.caps, capsViews, map[string]func(){
		"atomic_ops": func() { doc.add("atomic_cap", atomicCap(d.caps.AtomicOps)) },
	})
	var port object
	port.add("port", 1)
	port.addFields(d.port, portViews, nil)
	port.add("link_layer", link)
	port.add("gids", d.gids)
	doc.add("ports", []object{port})
	var quirks object
	quirks.addFields(d.quirks, quirksViews, nil)
	doc.add("quirks", quirks)
	doc.add("srq", d.srq)
	if d.recovered > 0 {
		doc.add("recovered_objects", d.recovered)
	}
	return json.Marshal(doc)
}

// The names ibv_devinfo prints for the codes of the port's and device's
// enumerations (rdma-core's examples/devinfo.c).
var (
	portStateNames = map[uint32]string{firmware.PortNop: "PORT_NOP", firmware.PortDown: "PORT_DOWN", firmware.PortInit: "PORT_INIT",
		firmware.PortArmed: "PORT_ARMED", firmware.PortActive: "PORT_ACTIVE", firmware.PortActiveDefer: "PORT_ACTIVE_DEFER"}
	mtuNames = map[uint32]string{firmware.MTU256: "256", firmware.MTU512: "512", firmware.MTU1024: "1024",
		firmware.MTU2048: "2048", firmware.MTU4096: "4096"}
	widthNames = map[uint32]string{1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}
	speedNames = map[uint32]string{1: "2.5 Gbps", 2: "5.0 Gbps", 4: "10.0 Gbps", 8: "10.0 Gbps", 16: "14.0 Gbps",
		32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps"}
	physStateNames = map[uint32]string{1: "SLEEP", 2: "POLLING", 3: "DISABLED", 4: "PORT_CONFIGURATION_TRAINING",
		5: "LINK_UP", 6: "LINK_ERROR_RECOVERY", 7: "PHY_TEST"}
	vlNames = map[uint32]string{1: "1", 2: "2", 3: "4", 4: "8", 5: "15"}
)

// enumName is code's name in names, or "unknown (code)".
func enumName(names map[uint32]string, code uint32) string {
	if n, ok := names[code]; ok {
		return n
	}
	return fmt.Sprintf("unknown (%d)", code)
}

func portStateName(s uint32) string { return enumName(portStateNames, s) }

// hex64 is a 64-bit value as ibv_devinfo prints it, and as JSON keeps it
// exact: a string.
func hex64(v uint64) string { return fmt.Sprintf("0x%x", v) }

// transportAndLink are ibv_devinfo's transport and link_layer for the
// device's mode: RoCE is the InfiniBand transport over Ethernet.
func transportAndLink(mode uint8) (transport, link string) {
	switch mode {
	case firmware.ModeRoCE:
		return "InfiniBand", "Ethernet"
	case firmware.ModeIWARP:
		return "iWARP", "Ethernet"
	case firmware.ModeIB:
		return "InfiniBand", "InfiniBand"
	}
	u := fmt.Sprintf("unknown (%d)", mode)
	return u, u
}

// atomicCap is ibv_devinfo's atomic_cap as Linux's vmw_pvrdma reports it:
// ATOMIC_HCA when the device runs compare-and-swap or fetch-and-add.
func atomicCap(ops uint8) string {
	if ops&(1<<0|1<<1) != 0 {
		return "ATOMIC_HCA"
	}
	return "ATOMIC_NONE"
}

// gidTypeNames names the GID types in a caps gid_types mask.
func gidTypeNames(mask uint8) []string {
	names := []string{}
	for bit, n := range map[uint8]string{firmware.GIDTypeRoCEv1: "RoCE v1", firmware.GIDTypeRoCEv2: "RoCE v2"} {
		if mask&bit != 0 {
			names = append(names, n)
			mask &^= bit
		}
	}
	slices.Sort(names)
	if mask != 0 {
		names = append(names, fmt.Sprintf("unknown (%#x)", mask))
	}
	return names
}

// newInfoDoc makes info's document from what the device reported.
func newInfoDoc(d *vfrdma.Device, port vfrdma.PortAttr) infoDoc {
	return infoDoc{
		bdf: d.Name(), vfio: d.VFIOPath(), version: d.Version(), caps: d.Caps(), port: port,
		gids: []string{d.GID().String()}, quirks: d.Quirks(),
		srq: newSRQInfo(d), recovered: d.Recovered(),
	}
}

// srqInfo is what matters to a user of shared receive queues beyond the
// device's max_srq, max_srq_wr and max_srq_sge.
type srqInfo struct {
	// MaxDepth is the largest SRQ the driver creates, by SGEs per receive
	// (index 0: 1 SGE), as the driver computes it (Device.MaxSRQDepth).
	MaxDepth []int `json:"max_depth_by_sge"`
	// LimitEvents says who raises low-watermark events.
	LimitEvents string `json:"low_watermark_events"`

	maxSRQWR, maxSGE int // the device's, for the text
}

func newSRQInfo(d *vfrdma.Device) srqInfo {
	c := d.Caps()
	s := srqInfo{maxSRQWR: int(c.MaxSRQWR), maxSGE: int(c.MaxSRQSGE), LimitEvents: "the driver, from its own counts", MaxDepth: []int{}}
	if d.Quirks().NoAsyncEvents {
		s.LimitEvents += " (the device sends none)"
	}
	for sge := 1; sge <= s.maxSGE; sge++ {
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
		s.maxSRQWR, firmware.MaxRingChunks)
}

// cmdInfo opens the device and prints its capabilities and port, in the
// spirit of ibv_devinfo -v.
func cmdInfo(e *env, args []string) error {
	fs := newFlagSet(e, "info")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := e.checkBDF(fs.Args()); err != nil {
		return err
	}
	d, err := e.open(fs.Args(), nil)
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
	doc := newInfoDoc(d, port)
	if err := d.Close(); err != nil {
		return err
	}
	if e.json {
		return e.printJSON(&doc)
	}
	printInfo(e.out, &doc)
	return nil
}

// vfioText names the VFIO path info shows: "cdev" or "group", "none (the
// model)" on the device model.
func vfioText(p string) string {
	if p == "" {
		return "none (the model)"
	}
	return p
}

func guid(v uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", v>>48, v>>32&0xffff, v>>16&0xffff, v&0xffff)
}

func printInfo(w io.Writer, d *infoDoc) {
	c, p := &d.caps, &d.port
	transport, link := transportAndLink(c.Mode)
	rows := []struct {
		k string
		v any
	}{
		{"hca_id", "pvrdma " + d.bdf},
		{"vfio", vfioText(d.vfio)},
		{"interface version", d.version},
		{"transport", transport},
		{"fw_ver", c.FWVersion()},
		{"node_guid", guid(c.NodeGUID)},
		{"sys_image_guid", guid(c.SysImageGUID)},
		{"phys_port_cnt", c.PhysPortCnt},
		{"max_mr_size", hex64(c.MaxMRSize)},
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
		{"atomic_cap", atomicCap(c.AtomicOps)},
		{"gid_tbl_len", c.GIDTblLen},
		{"gid_types", strings.Join(gidTypeNames(c.GIDTypes), ", ")},
		{"mode", map[uint8]string{0: "RoCE", 1: "iWARP", 2: "InfiniBand"}[c.Mode]},
		{"port 1 state", portStateName(p.State)},
		{"port 1 max_mtu", enumName(mtuNames, p.MaxMTU)},
		{"port 1 active_mtu", enumName(mtuNames, p.ActiveMTU)},
		{"port 1 link_layer", link},
		{"port 1 max_msg_sz", fmt.Sprintf("0x%x", p.MaxMsgSz)},
		{"port 1 gid_tbl_len", p.GIDTblLen},
		{"port 1 pkey_tbl_len", p.PKeyTblLen},
		{"port 1 active_width", enumName(widthNames, uint32(p.ActiveWidth))},
		{"port 1 active_speed", enumName(speedNames, uint32(p.ActiveSpeed))},
		{"port 1 GID[0]", d.gids[0]},
		{"srq max depth", d.srq.depthText()},
		{"srq depth limit", d.srq.limitText()},
		{"srq low watermark", "raised by " + d.srq.LimitEvents},
		{"quirks", fmt.Sprintf("emulated=%v cq_arm_both=%v no_async_events=%v", d.quirks.Emulated, d.quirks.CQArmBoth, d.quirks.NoAsyncEvents)},
	}
	for _, r := range rows {
		fmt.Fprintf(w, "%-22s %v\n", r.k+":", r.v)
	}
	if d.recovered > 0 {
		fmt.Fprintf(w, "%-22s %d (left by a process that died holding the device)\n", "recovered objects:", d.recovered)
	}
}
