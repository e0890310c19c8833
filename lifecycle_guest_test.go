//go:build guest

package vfrdma

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vfrdma/vfrdma/event"
	"github.com/vfrdma/vfrdma/qemu/proto"
	"github.com/vfrdma/vfrdma/vmxnet3"
)

// The lifecycle rule on the device (doc.go). Each misuse runs in a child
// process (TestMain runs the scenario named by scenarioEnv), so that a
// fault (a SIGSEGV, when a call reads memory Close unmapped) fails that
// test, not the whole suite.

const scenarioEnv = "VFRDMA_TEST_SCENARIO"

// lifecycleScenarios are the child's scenarios: each returns an error if a
// call did not return one wrapping ErrClosed.
func lifecycleScenarios() map[string]func(d *Device) error {
	ctx := context.Background()
	wantClosed := func(what string, err error) error {
		if !errors.Is(err, ErrClosed) {
			return fmt.Errorf("%s: %v, want an error wrapping ErrClosed", what, err)
		}
		return nil
	}
	return map[string]func(d *Device) error{
		"cq-poll-after-cq-close": func(d *Device) error {
			cq, err := d.CreateCQ(ctx, 16)
			if err != nil {
				return err
			}
			if err := cq.Close(); err != nil {
				return err
			}
			_, err = cq.Poll(make([]WC, 4))
			return errors.Join(wantClosed("CQ.Poll", err), d.Close())
		},
		"cq-after-device-close": func(d *Device) error {
			cq, err := d.CreateCQ(ctx, 16)
			if err != nil {
				return err
			}
			if err := d.Close(); err != nil {
				return err
			}
			_, perr := cq.Poll(make([]WC, 4))
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return errors.Join(wantClosed("CQ.Poll", perr), wantClosed("CQ.Arm", cq.Arm(false)),
				wantClosed("CQ.Wait", cq.Wait(wctx)))
		},
		"pollset-after-device-close": func(d *Device) error {
			cq, err := d.CreateCQ(ctx, 16)
			if err != nil {
				return err
			}
			ps := event.NewPollSet[int]()
			if err := ps.Add(cq.Source(), 1); err != nil {
				return err
			}
			if _, err := ps.Poll(make([]int, 4)); err != nil {
				return fmt.Errorf("PollSet.Poll before Close: %w", err)
			}
			if err := d.Close(); err != nil {
				return err
			}
			_, err = ps.Poll(make([]int, 4))
			return wantClosed("PollSet.Poll", err)
		},
		"poll-during-device-close": func(d *Device) error {
			r, err := newUDLoop(d, 64)
			if err != nil {
				return err
			}
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for _, cq := range []*CQ{r.cqs[0], r.cqs[1]} {
				wg.Go(func() {
					wcs := make([]WC, 16)
					for {
						if _, err := cq.Poll(wcs); err != nil {
							errs <- wantClosed("CQ.Poll while Close ran", err)
							return
						}
					}
				})
			}
			// Receives, not sends: QEMU 7.2 aborts when a QP is destroyed
			// with sends in flight in its backend (see TestShutdownStressGuest).
			wg.Go(func() {
				for i := uint64(0); ; i++ {
					_, err := r.postRecv(0, i)
					if err != nil && !errors.Is(err, ErrQueueFull) {
						errs <- wantClosed("QP.PostRecv while Close ran", err)
						return
					}
				}
			})
			time.Sleep(200 * time.Millisecond)
			cerr := d.Close()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				return errors.New("a poller or the poster outlived Device.Close by 20 s")
			}
			close(errs)
			all := []error{cerr}
			for err := range errs {
				all = append(all, err)
			}
			return errors.Join(all...)
		},
		"ethernet-send-after-device-close": func(d *Device) error {
			nic := d.Ethernet()
			if nic == nil {
				return errors.New("no Ethernet NIC")
			}
			if err := d.Close(); err != nil {
				return err
			}
			frame := make([]byte, 60)
			copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
			_, err := nic.Send([][]byte{frame})
			if !errors.Is(err, vmxnet3.ErrClosed) {
				return fmt.Errorf("NIC.Send after Device.Close: %v, want vmxnet3.ErrClosed", err)
			}
			return nil
		},
	}
}

// runScenario is the child: it opens the device, runs the scenario and
// exits 0 if it held.
func runScenario(name string) {
	f := lifecycleScenarios()[name]
	if f == nil {
		fmt.Println("scenario: unknown", name)
		os.Exit(3)
	}
	d, err := Open(os.Getenv(proto.EnvBDF), nil)
	if err != nil {
		fmt.Println("scenario: open:", err)
		os.Exit(3)
	}
	if err := f(d); err != nil {
		fmt.Println("scenario: failed:", err)
		d.Close()
		os.Exit(1)
	}
	d.Close()
	fmt.Println("scenario: ok")
	os.Exit(0)
}

// inChild runs scenario name in a child process and fails if the child
// did not report success: a fault, an error that was not ErrClosed, a hang.
func inChild(t *testing.T, name string) {
	t.Helper()
	guestBDF(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), scenarioEnv+"="+name)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "scenario: ok") {
		t.Fatalf("scenario %s: child %v\n%s", name, err, out)
	}
}

// CQ.Poll after CQ.Close returns ErrClosed, without touching the freed ring.
func TestCQPollAfterCQCloseReturnsErrClosed(t *testing.T) {
	inChild(t, "cq-poll-after-cq-close")
}

// CQ.Poll, CQ.Arm and CQ.Wait after Device.Close return ErrClosed, without
// touching the unmapped rings or doorbell page.
func TestCQCallsAfterDeviceCloseReturnErrClosed(t *testing.T) {
	inChild(t, "cq-after-device-close")
}

// PollSet.Poll after Device.Close returns ErrClosed: the notifier's Sync
// does not read the unmapped control pages.
func TestPollSetPollAfterDeviceCloseReturnsErrClosed(t *testing.T) {
	inChild(t, "pollset-after-device-close")
}

// Goroutines polling and posting while Device.Close runs return ErrClosed
// (or complete), within a bounded time, and none faults.
func TestPollingWhileDeviceClosesReturnsErrClosed(t *testing.T) {
	inChild(t, "poll-during-device-close")
}

// Device.Ethernet().Send after Device.Close returns the NIC's ErrClosed
// and does not fault in its link check. Device.Close closes the NIC before the
// container its memory lives in; the NIC's own refusal after its Close is
// package vmxnet3's (its lifecycle tests).
func TestEthernetSendAfterDeviceCloseReturnsErrClosed(t *testing.T) {
	inChild(t, "ethernet-send-after-device-close")
}

// A journal that lists handles the device never had recovers nothing:
// QEMU answers each DESTROY with EINVAL, so Recovered() is 0, not the
// number of entries. QP, CQ and SRQ handles: QEMU answers DESTROY_PD and
// DESTROY_MR with success whatever the handle.
func TestRecoveredIgnoresHandlesThatNeverExisted(t *testing.T) {
	bdf := guestBDF(t)
	dir := t.TempDir()
	bogus := journalFile{PID: 1, Objects: []journalEntry{
		{kindQP, 0x7fff0001}, {kindQP, 0x7fff0002}, {kindSRQ, 0x7fff0003}, {kindCQ, 0x7fff0004}, {kindCQ, 0x7fff0005},
	}}
	b, err := json.Marshal(bogus)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(journalPath(dir, bdf))), b, 0o600))
	d, err := Open(bdf, &Options{StateDir: dir})
	require.NoError(t, err)
	defer d.Close()
	assert.Zero(t, d.Recovered(), "objects recovered from a journal of handles that never existed")
	// The journal now lists this Open's own objects, none of the bogus.
	left, err := readJournal(journalPath(dir, bdf))
	require.NoError(t, err)
	for _, e := range left {
		assert.NotContains(t, bogus.Objects, e, "a bogus entry survived Open")
	}
}

// udLoop is two UD QPs on two CQs, each sending to the other.
type udLoop struct {
	d   *Device
	pd  *PD
	cqs [2]*CQ
	qps [2]*QP
	mr  *MR
	ah  *AH
}

func newUDLoop(d *Device, depth int) (*udLoop, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := &udLoop{d: d}
	var err error
	if r.pd, err = d.AllocPD(ctx); err != nil {
		return nil, err
	}
	for i := range r.cqs {
		if r.cqs[i], err = d.CreateCQ(ctx, 4*depth); err != nil {
			return nil, err
		}
		if r.qps[i], err = r.pd.CreateQP(ctx, &QPConfig{Type: UD, SendCQ: r.cqs[i], RecvCQ: r.cqs[i], SendDepth: depth, RecvDepth: depth, QKey: 0x1111}); err != nil {
			return nil, err
		}
		if err := r.qps[i].Connect(ctx, Remote{}, 0); err != nil {
			return nil, err
		}
	}
	if r.mr, err = r.pd.AllocMR(ctx, 1<<16, AccessLocalWrite); err != nil {
		return nil, err
	}
	if r.ah, err = r.pd.CreateAH(AHAttr{DGID: d.GID()}); err != nil {
		return nil, err
	}
	return r, nil
}

// post posts one send from QP i to the other, wr_id id.
func (r *udLoop) post(i int, id uint64) (int, error) {
	return r.qps[i].PostSend([]SendWR{{WRID: id, SGEs: []SGE{r.mr.SGE(0, 64)}, AH: r.ah, RemoteQPN: r.qps[1-i].QPN(), RemoteQKey: 0x1111}}, 0)
}

// postRecv posts one receive on QP i, wr_id id.
func (r *udLoop) postRecv(i int, id uint64) (int, error) {
	return r.qps[i].PostRecv([]RecvWR{{WRID: id, SGEs: []SGE{r.mr.SGE(4096+i*2048, 2048)}}}, 0)
}

// The shutdown stress test on the device: posters (sends and receives),
// pollers with CQ.Wait, a poll set and a wait set, while QPs go to ERR or
// are closed and the device is closed at random moments; dozens of rounds.
// No fault, no wr_id completed twice or without a post, every posted one
// completed or outstanding when its CQ went, and no goroutine left.
//
// The sends stop, and those in flight complete, before the first QP is
// destroyed; receives go on being posted through the closes. QEMU 7.2
// aborts (qemu_mutex_lock_impl: Assertion `mutex->initialized') when its
// RDMA backend completes a send of a QP destroyed meanwhile: the
// completion takes the destroyed QP's list lock. That is the bench's
// limit, not the driver's; the host stress test races posts of every kind
// with every close.
func TestShutdownStressGuest(t *testing.T) {
	bdf := guestBDF(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const rounds = 24
	total := 0
	for round := range rounds {
		total += guestStressRound(t, bdf, round)
		if t.Failed() {
			t.Fatalf("round %d failed", round)
		}
	}
	t.Logf("%d rounds, %d completions", rounds, total)
	require.NotZero(t, total, "nothing completed: the test tested nothing")
}

func guestStressRound(t *testing.T, bdf string, round int) int {
	rng := rand.New(rand.NewPCG(uint64(round), 18))
	d, err := Open(bdf, nil)
	require.NoError(t, err)
	r, err := newUDLoop(d, 64)
	require.NoError(t, err)
	ps := event.NewPollSet[int]()
	ws, err := event.NewWaitSet(event.FD)
	require.NoError(t, err)
	for i, cq := range r.cqs {
		require.NoError(t, ps.Add(cq.Source(), i))
		require.NoError(t, ws.Add(cq.Source()))
	}
	type key struct {
		qpn uint32
		id  uint64
	}
	var mu sync.Mutex
	posted, done := map[key]bool{}, map[key]int{}
	errs := make(chan error, 16)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	var wg sync.WaitGroup
	stopSends := make(chan struct{})
	var quiet sync.WaitGroup // the posters that have stopped sending
	quiet.Add(len(r.qps))
	for i := range r.qps {
		wg.Go(func() {
			sendsDone := sync.OnceFunc(quiet.Done)
			defer sendsDone()
			for id := uint64(0); ; {
				var n int
				var err error
				select {
				case <-stopSends:
					sendsDone()
					n, err = r.postRecv(i, id)
				default:
					if id%2 == 0 {
						n, err = r.postRecv(i, id)
					} else {
						n, err = r.post(i, id)
					}
				}
				if n == 1 {
					mu.Lock()
					posted[key{r.qps[i].QPN(), id}] = true
					mu.Unlock()
					id++
				}
				switch {
				case err == nil:
				case errors.Is(err, ErrQueueFull):
					time.Sleep(100 * time.Microsecond)
				case errors.Is(err, ErrClosed), errors.Is(err, ErrQPState):
					return
				default:
					fail(err)
					return
				}
			}
		})
	}
	for _, cq := range r.cqs {
		wg.Go(func() {
			wcs := make([]WC, 16)
			for {
				n, err := cq.Poll(wcs)
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				for _, wc := range wcs[:n] {
					done[key{wc.QPN, wc.WRID}]++
				}
				mu.Unlock()
				if n == 0 {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
					err := cq.Wait(ctx)
					cancel()
					if errors.Is(err, ErrClosed) {
						return
					}
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						fail(err)
						return
					}
				}
			}
		})
	}
	stopSets := make(chan struct{})
	wg.Go(func() {
		out := make([]int, 2)
		for {
			select {
			case <-stopSets:
				return
			default:
			}
			if _, err := ps.Poll(out); err != nil && !errors.Is(err, ErrClosed) {
				fail(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stopSets:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			err := ws.Wait(ctx)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return
			}
		}
	})

	time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
	close(stopSends)
	quiet.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for _, qp := range r.qps {
		for qp.sq.OutstandingP() > 0 {
			require.True(t, time.Now().Before(deadline), "round %d: QP %d's sends never completed", round, qp.QPN())
			time.Sleep(time.Millisecond)
		}
	}
	switch rng.IntN(3) {
	case 0:
		require.NoError(t, r.qps[rng.IntN(2)].Close())
	case 1:
		require.NoError(t, r.qps[rng.IntN(2)].SetError(context.Background()))
	}
	time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
	require.NoError(t, d.Close())
	close(stopSets)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		t.Fatalf("round %d: a goroutine outlived Device.Close by 30 s", round)
	}
	for _, cq := range r.cqs {
		_ = ws.Remove(cq.Source())
	}
	require.NoError(t, ws.Close())
	close(errs)
	for err := range errs {
		t.Errorf("round %d: %v", round, err)
	}
	mu.Lock()
	defer mu.Unlock()
	for k, n := range done {
		if n != 1 || !posted[k] {
			t.Errorf("round %d: QP %d wr_id %d completed %d times, posted %v", round, k.qpn, k.id, n, posted[k])
		}
	}
	for _, qp := range r.qps {
		sent, recv := qp.Outstanding()
		k := 0
		for p := range posted {
			if p.qpn == qp.QPN() {
				k++
			}
		}
		c := 0
		for p := range done {
			if p.qpn == qp.QPN() {
				c++
			}
		}
		if c+sent+recv != k {
			t.Errorf("round %d: QP %d: %d posted, %d completed, %d+%d outstanding when its CQ went", round, qp.QPN(), k, c, sent, recv)
		}
	}
	return len(done)
}
