package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/pci/pcitest"
)

var (
	// jsonKey is a key's form: snake_case.
	jsonKey = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	// camelSplit is what a generic camel-to-snake conversion makes of an
	// initialism (active_m_t_u, vendor_part_i_d, max_map_per_f_m_r).
	camelSplit = regexp.MustCompile(`(^|_)[a-z]_[a-z](_|$)`)
	// guidForm is ibv_devinfo's GUID: four groups of four hex digits.
	guidForm = regexp.MustCompile(`^[0-9a-f]{4}(:[0-9a-f]{4}){3}$`)
)

// jsonPaths decodes a JSON document into any and returns the path of
// every key in it ("ports[].state"; an array's elements share "[]"), and
// what is wrong with its keys: not snake_case, an initialism split letter
// by letter, a *_guid value not a string in ibv_devinfo's form, a key at
// two paths (the same name for two things, or one thing twice).
func jsonPaths(doc []byte) (paths, problems []string, err error) {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	where := map[string]string{} // key → its path
	var walk func(v any, prefix string)
	walk = func(v any, prefix string) {
		switch v := v.(type) {
		case map[string]any:
			for k, val := range v {
				p := prefix + k
				if !jsonKey.MatchString(k) {
					problems = append(problems, fmt.Sprintf("%s: not snake_case", p))
				}
				if camelSplit.MatchString(k) {
					problems = append(problems, fmt.Sprintf("%s: an initialism split letter by letter", p))
				}
				if strings.HasSuffix(k, "_guid") {
					if s, ok := val.(string); !ok || !guidForm.MatchString(s) {
						problems = append(problems, fmt.Sprintf("%s is %#v, want a string xxxx:xxxx:xxxx:xxxx", p, val))
					}
				}
				if other, ok := where[k]; ok && other != p {
					problems = append(problems, fmt.Sprintf("key %q at %s and at %s", k, other, p))
				}
				where[k] = p
				seen[p] = true
				walk(val, p+".")
			}
		case []any:
			for _, e := range v {
				walk(e, strings.TrimSuffix(prefix, ".")+"[].")
			}
		}
	}
	walk(v, "")
	for p := range seen {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	slices.Sort(problems)
	return paths, problems, nil
}

// checkJSON returns doc's key paths, failing t for what is wrong with them.
func checkJSON(t *testing.T, doc []byte) []string {
	t.Helper()
	paths, problems, err := jsonPaths(doc)
	require.NoError(t, err, "%s", doc)
	assert.Empty(t, problems)
	return paths
}

// Every command that prints JSON (on the model where it needs a device, on
// a fake sysfs tree for list, bind and unbind) prints keys of one form,
// GUIDs as ibv_devinfo writes them, every key once, and the keys listed
// here.
func TestJSONKeys(t *testing.T) {
	infoKeys := []string{"atomic_arg_sizes", "atomic_cap", "atomic_ops", "bdf", "bmme_flags", "device_cap_flags", "device_cap_flags2",
		"ex_comp_mask", "fw_ver", "gid_types", "hw_ver", "interface_version", "local_ca_ack_delay", "log_max_atomic_inline_arg",
		"max_ah", "max_cq", "max_cqe", "max_ee", "max_ee_init_rd_atom", "max_ee_rd_atom", "max_fa_bit_boundary",
		"max_fast_reg_page_list_len", "max_fmr", "max_gid_tbl_len", "max_map_per_fmr", "max_mcast_grp", "max_mcast_qp_attach",
		"max_mr", "max_mr_size", "max_mw", "max_pd", "max_pkeys", "max_qp", "max_qp_init_rd_atom", "max_qp_rd_atom", "max_qp_wr",
		"max_raw_ethy_qp", "max_raw_ipv6_qp", "max_rdd", "max_res_rd_atom", "max_sge", "max_sge_rd", "max_srq", "max_srq_sge",
		"max_srq_wr", "max_total_mcast_qp_attach", "max_uar", "node_guid", "page_size_cap", "phys_port_cnt", "ports",
		"ports[].active_mtu", "ports[].active_speed", "ports[].active_width", "ports[].bad_pkey_cntr", "ports[].gid_tbl_len",
		"ports[].gids", "ports[].init_type_reply", "ports[].link_layer", "ports[].max_msg_sz", "ports[].max_mtu",
		"ports[].max_vl_num", "ports[].phys_state", "ports[].pkey_tbl_len", "ports[].port", "ports[].port_cap_flags",
		"ports[].port_lid", "ports[].port_lmc", "ports[].qkey_viol_cntr", "ports[].sm_lid", "ports[].sm_sl", "ports[].state",
		"ports[].subnet_timeout", "quirks", "quirks.cq_arm_both", "quirks.emulated", "quirks.no_async_events",
		"quirks.srq_swap", "quirks.unquiesce_keeps_err", "srq", "srq.low_watermark_events", "srq.max_depth_by_sge",
		"sys_image_guid", "transport", "vendor_id", "vendor_part_id", "vfio"}
	listKeys := []string{"[].bdf", "[].device", "[].driver", "[].iommu_group", "[].kind", "[].vendor"}
	pingpongKeys := []string{"data_checked", "iters", "mbit_per_s", "round_trip_median_us", "round_trip_p99_us", "round_trip_us",
		"seconds", "size", "transport", "wait"}
	benchRowKeys := []string{"rows", "rows[].batch", "rows[].doorbells", "rows[].doorbells_per_message", "rows[].messages",
		"rows[].messages_per_s", "rows[].p50_us", "rows[].p99_us", "rows[].poll_us_per_msg", "rows[].post_us_per_msg",
		"rows[].seconds", "rows[].wait_us_per_msg"}
	benchKeys := append([]string{"latency", "mode", "rows[].receives_checked", "sender_spins", "size", "transport"}, benchRowKeys...)
	for _, tc := range []struct {
		name string
		args []string
		keys []string
	}{
		{"list", []string{"list"}, listKeys},
		{"bind --dry-run", []string{"bind", "--dry-run"}, []string{"dry_run", "plan", "plan.iommu_group", "plan.members",
			"plan.members[].action", "plan.members[].bdf", "plan.members[].driver", "plan.members[].netdevs",
			"plan.members[].vendor_device", "plan.refused"}},
		{"bind", []string{"bind"}, []string{"bound", "iommu_group", "previous", "previous[].bdf", "previous[].driver"}},
		{"unbind", []string{"unbind"}, []string{"bound", "iommu_group"}},
		{"info v20", []string{"--model", "v20", "info"}, infoKeys},
		{"info qemu", []string{"--model", "qemu", "info"}, infoKeys},
		{"regs", []string{"--model", "v20", "regs"}, []string{"device_name", "model", "registers", "registers[].name", "registers[].offset", "registers[].value"}},
		{"pingpong", []string{"--model", "qemu", "pingpong", "--iters", "20", "--size", "64"}, pingpongKeys},
		{"pingpong --write", []string{"--model", "v20", "pingpong", "--write", "--iters", "20"}, append([]string{"operation"}, pingpongKeys...)},
		{"pingpong --read", []string{"--model", "v20", "pingpong", "--read", "--iters", "20"},
			[]string{"data_checked", "iters", "mbit_per_s", "operation", "round_trip_us", "seconds", "size", "transport", "wait"}},
		{"pingpong --srq", []string{"--model", "qemu", "pingpong", "--srq", "2", "--iters", "10"}, nil},
		{"bench", []string{"--model", "qemu", "bench", "--messages", "200", "--batches", "1,8"}, benchKeys},
		{"bench --atomic", []string{"--model", "v20", "bench", "--atomic", "--messages", "100", "--batches", "1"},
			append([]string{"latency", "mode", "operation", "rows[].checked", "rows[].word", "sender_spins", "size", "transport"}, benchRowKeys...)},
		{"bench --wait", []string{"--model", "qemu", "bench", "--wait", "--messages", "200", "--batches", "1"}, nil},
		{"am", []string{"--model", "qemu", "am", "--sizes", "8", "--iters", "10", "--messages", "50", "--bw-size", "4096", "--bw-messages", "4"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := pcitest.VMwareSlot(t)
			var out, errb bytes.Buffer
			e := &env{out: &out, errOut: &errb, bus: fake.Bus(), runDir: t.TempDir()}
			code := run(e, append([]string{"--sysfs", fake.Root, "--json"}, tc.args...))
			require.Equal(t, 0, code, "%s", errb.String())
			keys := checkJSON(t, out.Bytes())
			if tc.keys != nil {
				want := slices.Clone(tc.keys)
				slices.Sort(want)
				assert.Equal(t, want, keys)
			} else {
				assert.NotEmpty(t, keys)
			}
			if strings.HasPrefix(tc.name, "info") {
				var doc map[string]any
				require.NoError(t, json.Unmarshal(out.Bytes(), &doc))
				port := doc["ports"].([]any)[0].(map[string]any)
				assert.Equal(t, "PORT_ACTIVE", port["state"])
				assert.Contains(t, []string{"256", "512", "1024", "2048", "4096"}, port["active_mtu"])
				assert.Equal(t, "Ethernet", port["link_layer"])
				assert.Equal(t, "InfiniBand", doc["transport"])
				assert.Regexp(t, `^0x[0-9a-f]+$`, doc["max_mr_size"])
				assert.Regexp(t, `^\d+\.\d+\.\d+$`, doc["fw_ver"])
			}
		})
	}
}

// list --json on a host without the NIC prints an empty list, not null,
// and exits 0.
func TestListJSONWithoutTheNIC(t *testing.T) {
	code, out, errOut, _ := runPvctl(t, "--json", "list")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "[]\n", out)
}

// eth needs the slot's vmxnet3 (not on the model): its documents' keys
// are checked as its types marshal them.
func TestEthJSONKeys(t *testing.T) {
	for _, tc := range []struct {
		v    any
		keys []string
	}{
		{ethDoc{}, []string{"bdf", "link", "mac", "mtu", "rdma_port_state", "stats", "stats.rx_bytes", "stats.rx_drops",
			"stats.rx_frames", "stats.rx_truncated", "stats.rx_waits", "stats.tx_bytes", "stats.tx_doorbells",
			"stats.tx_errors", "stats.tx_frames"}},
		{[]genRow{{}}, []string{"[].batch", "[].doorbells_per_packet", "[].frames", "[].mbit_per_s", "[].packets_per_s", "[].size"}},
		{[]sinkRow{{}}, []string{"[].batch", "[].device_drops", "[].link_lost", "[].packets_per_s", "[].received", "[].sent", "[].size"}},
	} {
		b, err := json.Marshal(tc.v)
		require.NoError(t, err)
		assert.Equal(t, tc.keys, checkJSON(t, b), "%T", tc.v)
	}
}

// The key checks catch what they are for: a camel-case conversion's keys,
// a GUID as a number, one key at two places.
func TestJSONKeyChecksCatchSplitInitialismsNumericGUIDsAndRepeatedKeys(t *testing.T) {
	for _, doc := range []string{
		`{"port": {"active_m_t_u": 3}}`,
		`{"vendor_part_i_d": 1}`,
		`{"max_map_per_f_m_r": 1}`,
		`{"node_guid": 5788052143566222422}`,
		`{"node_guid": "5054:00ff:fe12:3456", "caps": {"node_guid": "5054:00ff:fe12:3456"}}`,
		`{"ActiveMTU": 3}`,
		`{"0000:00:10.0": "vmxnet3"}`,
	} {
		_, problems, err := jsonPaths([]byte(doc))
		require.NoError(t, err)
		assert.NotEmpty(t, problems, "%s passes", doc)
	}
}

// info's enumerations read as ibv_devinfo names their codes; a code it has
// no name for says so with its number.
func TestInfoNames(t *testing.T) {
	assert.Equal(t, "PORT_ACTIVE", portStateName(4))
	assert.Equal(t, "PORT_DOWN", portStateName(1))
	assert.Equal(t, "unknown (9)", portStateName(9))
	assert.Equal(t, "1024", enumName(mtuNames, 3))
	assert.Equal(t, "unknown (0)", enumName(mtuNames, 0))
	assert.Equal(t, "12X", enumName(widthNames, 8))
	assert.Equal(t, "2.5 Gbps", enumName(speedNames, 1))
	assert.Equal(t, "LINK_UP", enumName(physStateNames, 5))
	assert.Equal(t, "15", enumName(vlNames, 5))
	for ops, want := range map[uint8]string{0: "ATOMIC_NONE", 1: "ATOMIC_HCA", 2: "ATOMIC_HCA", 3: "ATOMIC_HCA", 4: "ATOMIC_NONE"} {
		assert.Equal(t, want, atomicCap(ops), "atomic_ops %d", ops)
	}
	assert.Equal(t, []string{}, gidTypeNames(0))
	assert.Equal(t, []string{"RoCE v1"}, gidTypeNames(1))
	assert.Equal(t, []string{"RoCE v2"}, gidTypeNames(2))
	assert.Equal(t, []string{"RoCE v1", "RoCE v2"}, gidTypeNames(3))
	assert.Equal(t, []string{"RoCE v1", "unknown (0xc)"}, gidTypeNames(0xd))
	for mode, want := range map[uint8][2]string{0: {"InfiniBand", "Ethernet"}, 1: {"iWARP", "Ethernet"}, 2: {"InfiniBand", "InfiniBand"}, 3: {"unknown (3)", "unknown (3)"}} {
		tr, link := transportAndLink(mode)
		assert.Equal(t, want, [2]string{tr, link}, "mode %d", mode)
	}
	assert.Equal(t, "0xffffffffffffffff", hex64(1<<64-1))
	assert.Equal(t, "5054:00ff:fe12:3456", guid(0x505400fffe123456))
}
