package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/pvsim"
)

// runJSON runs a pvctl command on --model spec (and fabric, if set) and
// decodes its JSON report into v.
func runJSON(t *testing.T, spec string, fabric *pvsim.Fabric, cmd func(*env, []string) error, args []string, v any) {
	t.Helper()
	var out bytes.Buffer
	e := &env{out: &out, model: spec, fabric: fabric, json: true}
	require.NoError(t, cmd(e, args), "%v", args)
	require.NoError(t, json.Unmarshal(out.Bytes(), v), "%s", out.String())
}

// Every traffic mode runs on the model in loopback, both ends in this
// process, at version 17 and at version 20 (QP handles apart from QP
// numbers): the SEND ping-pong and bench, and the one-sided ones, each
// reporting what it checked.
func TestTrafficOnTheModel(t *testing.T) {
	const iters, messages = 50, 600 // messages > 512: every target slot written
	for _, spec := range []string{"v17", "v20"} {
		t.Run(spec, func(t *testing.T) {
			t.Run("pingpong", func(t *testing.T) {
				var r pingpongResult
				runJSON(t, spec, nil, cmdPingpong, []string{"--iters", "50", "--size", "1000"}, &r)
				assert.Equal(t, pingpongResult{Transport: "RC", Size: 1000, Iters: iters, Checked: true, Wait: "spin"}, stripTimes(r))
			})
			t.Run("pingpong --write", func(t *testing.T) {
				var r pingpongResult
				runJSON(t, spec, nil, cmdPingpong, []string{"--write", "--iters", "50", "--size", "1000"}, &r)
				assert.Equal(t, pingpongResult{Transport: "RC", Operation: "RDMA_WRITE_WITH_IMM", Size: 1000, Iters: iters, Checked: true, Wait: "spin"}, stripTimes(r))
			})
			t.Run("pingpong --read", func(t *testing.T) {
				var r pingpongResult
				runJSON(t, spec, nil, cmdPingpong, []string{"--read", "--iters", "50", "--size", "1000"}, &r)
				assert.Equal(t, pingpongResult{Transport: "RC", Operation: "RDMA_READ", Size: 1000, Iters: iters, Checked: true, Wait: "spin"}, stripTimes(r))
			})
			t.Run("bench", func(t *testing.T) {
				var r benchResult
				runJSON(t, spec, nil, cmdBench, []string{"--messages", "600", "--batches", "1,32"}, &r)
				require.Len(t, r.Rows, 2)
				assert.Equal(t, "loopback", r.Mode)
				for _, row := range r.Rows {
					assert.Equal(t, messages, row.Messages)
					assert.Equal(t, messages, row.ReceivesChecked)
				}
			})
			for _, tc := range []struct {
				flag, op string
				size     int
				check    func(t *testing.T, row benchRow)
			}{
				{"--write", "RDMA_WRITE", 64, func(t *testing.T, row benchRow) {
					assert.Equal(t, 512, row.TargetChecked, "every target slot holds the pattern")
				}},
				{"--read", "RDMA_READ", 64, func(t *testing.T, row benchRow) {
					assert.Equal(t, messages, row.Checked, "every READ's bytes checked")
				}},
				{"--atomic", "ATOMIC_FETCH_AND_ADD", 8, func(t *testing.T, row benchRow) {
					assert.Equal(t, messages, row.Checked, "every value fetched checked")
					assert.Equal(t, uint64(messages), row.Word, "the word after the batch")
				}},
			} {
				t.Run("bench "+tc.flag, func(t *testing.T) {
					var r benchResult
					runJSON(t, spec, nil, cmdBench, []string{tc.flag, "--messages", "600", "--batches", "1,32"}, &r)
					assert.Equal(t, tc.op, r.Operation)
					assert.Equal(t, tc.size, r.Size)
					assert.Equal(t, "loopback", r.Mode)
					require.Len(t, r.Rows, 2)
					for i, row := range r.Rows {
						assert.Equal(t, []int{1, 32}[i], row.Batch)
						assert.Equal(t, messages, row.Messages)
						assert.InDelta(t, []float64{1, 1.0 / 32}[i], row.DoorbellsPerMsg, 0.01, "a batch is one doorbell")
						tc.check(t, row)
					}
				})
			}
		})
	}
}

// stripTimes zeroes what a run measures, leaving what it did.
func stripTimes(r pingpongResult) pingpongResult {
	r.Seconds, r.RoundTripUS, r.MbitPerSec, r.MedianUS, r.P99US = 0, 0, 0, 0, 0
	return r
}

// The text reports say what was checked.
func TestOneSidedText(t *testing.T) {
	for _, tc := range []struct {
		cmd  func(*env, []string) error
		args []string
		want []string
	}{
		{cmdPingpong, []string{"--write", "--iters", "20"}, []string{"RC pingpong (RDMA WRITE WITH IMMEDIATE): 20 round trips of 4096 bytes", "every byte checked"}},
		{cmdPingpong, []string{"--read", "--iters", "20"}, []string{"RC pingpong (RDMA READ): 20 READs of 4096 bytes", "every byte checked"}},
		{cmdBench, []string{"--atomic", "--messages", "100", "--batches", "8"}, []string{"RC ATOMIC_FETCH_AND_ADD bench, 8 bytes per operation, loopback", "fetches checked", "word after", " 100 "}},
	} {
		var out bytes.Buffer
		e := &env{out: &out, model: "v20"}
		require.NoError(t, tc.cmd(e, tc.args), "%v", tc.args)
		for _, w := range tc.want {
			assert.Contains(t, out.String(), w, "%v", tc.args)
		}
	}
}

// On QEMU's device (--model qemu, as in the bench's VMs) the one-sided
// modes fail at once with the driver's ErrNotSupported and say why,
// having printed nothing.
func TestOneSidedRefusedOnQEMU(t *testing.T) {
	for _, tc := range []struct {
		cmd  func(*env, []string) error
		args []string
	}{
		{cmdPingpong, []string{"--write"}},
		{cmdPingpong, []string{"--read"}},
		{cmdBench, []string{"--write"}},
		{cmdBench, []string{"--read"}},
		{cmdBench, []string{"--atomic"}},
	} {
		var out bytes.Buffer
		e := &env{out: &out, model: "qemu"}
		err := tc.cmd(e, tc.args)
		require.ErrorIs(t, err, vfrdma.ErrNotSupported, "%v", tc.args) // a stall would end in another error
		assert.Contains(t, err.Error(), tc.args[0]+": ")
		assert.Contains(t, err.Error(), "QEMU 7.2")
		assert.Empty(t, out.String())
	}
}

// What the one-sided modes cannot run with is refused before any device
// is opened.
func TestOneSidedFlags(t *testing.T) {
	for _, tc := range []struct {
		cmd  func(*env, []string) error
		args []string
		want string
	}{
		{cmdPingpong, []string{"--write", "--ud"}, "--write needs RC QPs"},
		{cmdBench, []string{"--ud", "--atomic"}, "--atomic needs RC QPs"},
		{cmdBench, []string{"--write", "--read"}, "exclude each other"},
		{cmdPingpong, []string{"--read", "--srq", "2"}, "--read and --srq exclude each other"},
		{cmdBench, []string{"--read", "--spin"}, "the target posts nothing"},
		{cmdPingpong, []string{"--write", "--rdma-core", "--connect", "h"}, "no --rdma-core"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			e, out, _ := testEnv(t)
			err := tc.cmd(e, tc.args)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, out.String())
		})
	}
}

// freeAddr returns a localhost TCP address nobody listens on.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// twoEnds runs cmd as a server and a client, each on a model of its own,
// the two models on one fabric, and decodes their JSON reports (or
// returns their errors).
func twoEnds(t *testing.T, cmd func(*env, []string) error, srvArgs, cliArgs []string, srv, cli any) (srvErr, cliErr error) {
	t.Helper()
	fab := pvsim.NewFabric()
	addr := freeAddr(t)
	var outs [2]bytes.Buffer
	var errs [2]error
	var wg sync.WaitGroup
	for i, args := range [][]string{append([]string{"--listen", addr}, srvArgs...), append([]string{"--connect", addr}, cliArgs...)} {
		e := &env{out: &outs[i], model: "v20", fabric: fab, json: true}
		wg.Go(func() { errs[i] = cmd(e, args) })
	}
	wg.Wait()
	for i, v := range []any{srv, cli} {
		if errs[i] == nil && v != nil {
			require.NoError(t, json.Unmarshal(outs[i].Bytes(), v), "%s", outs[i].String())
		}
	}
	return errs[0], errs[1]
}

// Between two hosts (two models on one fabric, over --listen/--connect)
// the ends exchange their target regions' address and rkey: the client
// initiates, the server is the target and checks its own memory.
func TestOneSidedBetweenTwoEnds(t *testing.T) {
	t.Run("bench --write", func(t *testing.T) {
		var srv, cli benchResult
		args := []string{"--write", "--messages", "600", "--batches", "1,32"}
		e1, e2 := twoEnds(t, cmdBench, args, args, &srv, &cli)
		require.NoError(t, e1)
		require.NoError(t, e2)
		assert.Equal(t, "target", srv.Mode)
		assert.Equal(t, "initiator", cli.Mode)
		require.Len(t, srv.Rows, 2)
		require.Len(t, cli.Rows, 2)
		for i := range srv.Rows {
			assert.Equal(t, 512, srv.Rows[i].TargetChecked, "the target found every slot written")
			assert.Equal(t, 600, cli.Rows[i].Messages)
		}
	})
	t.Run("bench --atomic", func(t *testing.T) {
		var srv, cli benchResult
		args := []string{"--atomic", "--messages", "300", "--batches", "8"}
		e1, e2 := twoEnds(t, cmdBench, args, args, &srv, &cli)
		require.NoError(t, e1)
		require.NoError(t, e2)
		require.Len(t, srv.Rows, 1)
		require.Len(t, cli.Rows, 1)
		assert.Equal(t, uint64(300), srv.Rows[0].Word, "the word in the target's memory")
		assert.Equal(t, uint64(300), cli.Rows[0].Word, "the word read back")
		assert.Equal(t, 300, cli.Rows[0].Checked)
	})
	t.Run("bench --read", func(t *testing.T) {
		var cli benchResult
		args := []string{"--read", "--messages", "300", "--batches", "8"}
		e1, e2 := twoEnds(t, cmdBench, args, args, nil, &cli)
		require.NoError(t, e1)
		require.NoError(t, e2)
		require.Len(t, cli.Rows, 1)
		assert.Equal(t, 300, cli.Rows[0].Checked)
	})
	t.Run("pingpong --write", func(t *testing.T) {
		var srv, cli pingpongResult
		args := []string{"--write", "--iters", "50"}
		e1, e2 := twoEnds(t, cmdPingpong, args, args, &srv, &cli)
		require.NoError(t, e1)
		require.NoError(t, e2)
		for _, r := range []pingpongResult{srv, cli} {
			assert.Equal(t, pingpongResult{Transport: "RC", Operation: "RDMA_WRITE_WITH_IMM", Size: 4096, Iters: 50, Checked: true, Wait: "spin"}, stripTimes(r))
		}
	})
	t.Run("pingpong --read", func(t *testing.T) {
		var srv, cli pingpongResult
		args := []string{"--read", "--iters", "50"}
		e1, e2 := twoEnds(t, cmdPingpong, args, args, &srv, &cli)
		require.NoError(t, e1)
		require.NoError(t, e2)
		assert.Equal(t, "target", srv.Role)
		assert.Equal(t, pingpongResult{Transport: "RC", Operation: "RDMA_READ", Size: 4096, Iters: 50, Checked: true, Wait: "spin"}, stripTimes(cli))
	})
	// Ends that disagree on the mode, or on the size, say so.
	t.Run("mismatch", func(t *testing.T) {
		e1, e2 := twoEnds(t, cmdBench, []string{"--write"}, []string{"--read"}, nil, nil)
		for _, err := range []error{e1, e2} {
			require.Error(t, err)
			assert.Contains(t, err.Error(), "give both ends the same mode")
		}
		e1, e2 = twoEnds(t, cmdPingpong, []string{"--write", "--size", "100"}, []string{"--write"}, nil, nil)
		for _, err := range []error{e1, e2} {
			require.Error(t, err)
			assert.Contains(t, err.Error(), "give both ends the same --size")
		}
	})
}

// A ping-pong times each round trip and reports their median and 99th
// percentile beside the mean (ib_send_lat's t_typical is a median): the
// tail is at least the median, and both are measured, not zero.
func TestPingpongReportsTheMedianAndTheTailOfItsRoundTrips(t *testing.T) {
	var r pingpongResult
	runJSON(t, "qemu", nil, cmdPingpong, []string{"--iters", "200", "--size", "64"}, &r)
	assert.Positive(t, r.MedianUS)
	assert.GreaterOrEqual(t, r.P99US, r.MedianUS)
	var out bytes.Buffer
	require.NoError(t, cmdPingpong(&env{out: &out, model: "qemu"}, []string{"--iters", "20", "--size", "64"}))
	assert.Regexp(t, `µs per round trip \(median [0-9.]+ µs, 99th percentile [0-9.]+ µs\)`, out.String())
}

// Every message a ping-pong receives is checked, at each end, the last
// ones too (a receive's check waits for the end's next send, and the
// last has none), in order, over RC and UD.
func TestEveryPingpongMessageIsCheckedTheLastToo(t *testing.T) {
	for _, tr := range []string{"--rc", "--ud"} {
		var seen []int
		checkMessage = func(b []byte, seq int) error {
			seen = append(seen, seq)
			return checkPattern(b, seq)
		}
		var out bytes.Buffer
		err := cmdPingpong(&env{out: &out, model: "qemu"}, []string{tr, "--iters", "20", "--size", "300"})
		checkMessage = checkPattern
		require.NoError(t, err, tr)
		require.Len(t, seen, 40, "%s: 20 messages each way", tr)
		for i := 0; i < 20; i++ {
			assert.Equal(t, 2, occurrences(seen, i), "%s: message %d checked at both ends", tr, i)
		}
	}
}

func occurrences(xs []int, x int) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}

// A one-sided end takes the peer's target region only if the terms match
// and the region holds every slot: a region of exactly depth·slot bytes
// is taken, one byte less is refused, as are a missing region, terms that
// do not parse, and a peer that offers other than one QP.
func TestOneSidedEndTakesAPeerRegionThatHoldsItsSlots(t *testing.T) {
	e := &endpoint{depth: 4, slot: 64, sided: sideWrite}
	data := terms{OneSided: sideWrite, Slot: 64}.encode()
	peer := func(regions ...connect.Region) connect.Info {
		return connect.Info{Endpoints: []connect.Endpoint{{QPN: 1}}, Regions: regions, Data: data}
	}
	region := connect.Region{Addr: 0x1000, RKey: 9, Len: 4 * 64}
	require.NoError(t, e.checkPeer(peer(region)))
	assert.Equal(t, region, e.target)

	short := region
	short.Len--
	assert.ErrorContains(t, e.checkPeer(peer(short)), "the other end's target region holds 255 bytes, this end needs 256")
	assert.ErrorContains(t, e.checkPeer(peer()), "the other end offers 0 target regions, want 1")
	assert.ErrorContains(t, e.checkPeer(peer(region, region)), "the other end offers 2 target regions, want 1")
	bad := peer(region)
	bad.Data = []byte("write")
	assert.ErrorContains(t, e.checkPeer(bad), `the other end's terms "write"`)
	two := peer(region)
	two.Endpoints = append(two.Endpoints, connect.Endpoint{QPN: 2})
	assert.ErrorContains(t, e.connect(context.Background(), two), "the other end offers 2 QPs, this end has 1")

	send := &endpoint{depth: 4, slot: 64}
	assert.ErrorContains(t, send.checkPeer(peer(region)), "the other end runs with --write, this one with no one-sided flag (SEND)")
	assert.NoError(t, send.checkPeer(connect.Info{Endpoints: []connect.Endpoint{{QPN: 1}}}), "SEND: no terms, no region")
}

var (
	modelFigures  = regexp.MustCompile(`(?m)^pvctl: model v20 \S* ?\(pid \d+\): .* (\d+) packets, \d+ dropped, \d+ retransmitted`)
	fabricFigures = regexp.MustCompile(`(?m)^pvctl: fabric \S+ \(pid \d+\): (\d+) frames out, \d+ in`)
)

// --fabric puts each process's model on the fabric of one directory: two
// pvctl runs, each joining it on its own (two nodes, as two processes
// are), run a ping-pong and the RDMA WRITE bench over --listen/--connect,
// their packets crossing the directory's sockets.
func TestTwoPvctlRunsOnOneFabricDirectoryTalk(t *testing.T) {
	dir, err := os.MkdirTemp("", "pvf")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, cmd := range [][]string{
		{"pingpong", "--rc", "--size", "4096", "--iters", "200"},
		{"bench", "--write", "--messages", "300", "--batches", "1,32"},
	} {
		t.Run(cmd[0], func(t *testing.T) {
			addr := freeAddr(t)
			var outs, errOuts [2]bytes.Buffer
			var codes [2]int
			var wg sync.WaitGroup
			for i, end := range [][]string{{"--listen", addr}, {"--connect", addr}} {
				args := append([]string{"--model", "v20", "--fabric", dir}, cmd...)
				args = append(args, end...)
				e := &env{out: &outs[i], errOut: &errOuts[i]}
				wg.Go(func() { codes[i] = run(e, args) })
			}
			wg.Wait()
			for i := range codes {
				require.Equal(t, 0, codes[i], "end %d: %s%s", i, outs[i].String(), errOuts[i].String())
				// Each process tells its own model's figures and its
				// fabric's.
				m := modelFigures.FindStringSubmatch(errOuts[i].String())
				require.NotNil(t, m, "end %d's model figures: %s", i, errOuts[i].String())
				assert.NotEqual(t, "0", m[1], "end %d's model moved packets", i)
				f := fabricFigures.FindStringSubmatch(errOuts[i].String())
				require.NotNil(t, f, "end %d's fabric figures: %s", i, errOuts[i].String())
				assert.NotEqual(t, "0", f[1], "end %d sent frames to the other process", i)
			}
			socks, err := filepath.Glob(filepath.Join(dir, "node", "*.sock"))
			require.NoError(t, err)
			assert.Empty(t, socks, "each run left the directory as it closed")
		})
	}
	t.Run("--fabric without --model", func(t *testing.T) {
		var out, errOut bytes.Buffer
		e := &env{out: &out, errOut: &errOut}
		assert.Equal(t, 2, run(e, []string{"--fabric", dir, "info"}))
		assert.Contains(t, errOut.String(), "give --model too")
		assert.Zero(t, e.reached)
	})
}
