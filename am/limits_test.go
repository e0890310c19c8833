//go:build !guest

package am

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/pvsim"
)

// checkConfig is what New checks of a configuration before it touches the
// device, against an SRQ that holds anything and a CQ of maxCQEntries.
func checkConfig(cfg Config) error {
	if err := cfg.fill(); err != nil {
		return err
	}
	return cfg.fits(1<<20, maxCQEntries)
}

// Every limit Config states is taken at the limit and refused one past
// it: Tasks 1 to 819 (the most whose completions fit one CQ at 2
// credits), Self 0 to Tasks-1, PacketSize 256 to 1 MiB, Credits from 2 to
// as many as fit one CQ (Tasks × (2×Credits+1) completions at most 4096),
// MaxMessage at most 1 TiB, MaxUHdr a multiple of 8 from 8 to
// min(PacketSize-32, 65528).
func TestConfigLimitsAreTakenAtTheLimitAndRefusedOnePast(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		err  error // nil: taken
	}{
		{"1 task", Config{Tasks: 1}, nil},
		{"-1 tasks", Config{Tasks: -1}, errInvalid},
		{"819 tasks", Config{Tasks: 819}, nil},
		{"820 tasks", Config{Tasks: 820}, errInvalid},
		{"819 tasks at 2 credits", Config{Tasks: 819, Credits: 2}, nil},
		{"820 tasks at 2 credits", Config{Tasks: 820, Credits: 2}, errInvalid},
		{"the first task", Config{Tasks: 2, Self: 0}, nil},
		{"the last task", Config{Tasks: 2, Self: 1}, nil},
		{"a task past the last", Config{Tasks: 2, Self: 2}, ErrTarget},
		{"a task below the first", Config{Tasks: 2, Self: -1}, ErrTarget},
		{"256-byte packets", Config{PacketSize: 256}, nil},
		{"255-byte packets", Config{PacketSize: 255}, errInvalid},
		{"1 MiB packets", Config{PacketSize: 1 << 20}, nil},
		{"packets one byte over 1 MiB", Config{PacketSize: 1<<20 + 1}, errInvalid},
		{"2 credits", Config{Credits: 2}, nil},
		{"1 credit", Config{Credits: 1}, errInvalid},
		{"1 task, 2047 credits: 4095 completions", Config{Tasks: 1, Credits: 2047}, nil},
		{"1 task, 2048 credits: 4097 completions", Config{Tasks: 1, Credits: 2048}, errInvalid},
		{"4 tasks, 511 credits: 4092 completions", Config{Tasks: 4, Credits: 511}, nil},
		{"4 tasks, 512 credits: 4100 completions", Config{Tasks: 4, Credits: 512}, errInvalid},
		{"4097 credits", Config{Tasks: 1, Credits: 4097}, errInvalid},
		{"1 TiB messages", Config{MaxMessage: 1 << 40}, nil},
		{"messages one byte over 1 TiB", Config{MaxMessage: 1<<40 + 1}, errInvalid},
		{"a negative maximum message", Config{MaxMessage: -1}, errInvalid},
		{"an 8-byte user header", Config{MaxUHdr: 8}, nil},
		{"a negative user header", Config{MaxUHdr: -8}, errInvalid},
		{"a user header not whole words", Config{MaxUHdr: 12}, errInvalid},
		{"a user header filling a 256-byte packet", Config{PacketSize: 256, MaxUHdr: 224}, nil},
		{"a user header a word past a 256-byte packet", Config{PacketSize: 256, MaxUHdr: 232}, errInvalid},
		{"a user header of 65528 bytes", Config{PacketSize: 1 << 20, MaxUHdr: 65528}, nil},
		{"a user header of 65536 bytes", Config{PacketSize: 1 << 20, MaxUHdr: 65536}, errInvalid},
	} {
		err := checkConfig(tc.cfg)
		if tc.err == nil {
			assert.NoError(t, err, tc.name)
		} else {
			assert.ErrorIs(t, err, tc.err, tc.name)
		}
	}
	cfg := Config{PacketSize: 256}
	require.NoError(t, cfg.fill())
	assert.Equal(t, 224, cfg.MaxUHdr, "the default user header, in a packet smaller than it needs")
}

// The receive buffers, Tasks × Credits, must fit the device's SRQ: at its
// depth they do, one past it New refuses them.
func TestConfigWhoseBuffersFillTheSRQIsTakenAndOneMoreRefused(t *testing.T) {
	cfg := Config{Tasks: 8, Credits: 16}
	require.NoError(t, cfg.fill())
	assert.NoError(t, cfg.fits(128, maxCQEntries))
	err := cfg.fits(127, maxCQEntries)
	assert.ErrorIs(t, err, errInvalid)
	assert.Contains(t, err.Error(), "at most 127")
}

// allAddresses returns every task's address for a job of n tasks whose
// other tasks are nobody: QP numbers no QP has (New connects to them;
// nothing is sent).
func allAddresses(n int) [][]byte {
	all := make([][]byte, n)
	for i := range all {
		b := make([]byte, 16, 20+4*n)
		b = binary.LittleEndian.AppendUint32(b, uint32(0x10000+i)) // its first PSN
		for j := range n {
			b = binary.LittleEndian.AppendUint32(b, uint32(0xf00000+i*n+j))
		}
		all[i] = b
	}
	return all
}

// New serves the most tasks Config states, 819, on the model (a QP per
// task, a CQ of 4095 entries); at 820 it refuses the job before it
// allocates anything, with default credits or 2.
func TestNewServes819TasksAndRefuses820(t *testing.T) {
	d, m := openModel(t, pvsim.Config{QEMU: true})
	ctx := withTimeout(t, 5*time.Minute) // a hang guard
	c, err := New(ctx, d, Config{Tasks: 819, PacketSize: 256, Exchange: &fixedExchanger{all: allAddresses(819)}})
	require.NoError(t, err)
	assert.Equal(t, 2, c.cfg.Credits)
	require.NoError(t, c.Close())
	before := m.Objects()
	for _, credits := range []int{0, 2} {
		_, err := New(ctx, d, Config{Tasks: 820, Credits: credits, PacketSize: 256, Exchange: &fixedExchanger{all: allAddresses(820)}})
		assert.ErrorIs(t, err, errInvalid, "%d credits", credits)
	}
	assert.Equal(t, before, m.Objects(), "nothing allocated for 820 tasks")
}

// New refuses a job it cannot connect, with nothing left allocated: more
// than one task and no Exchange, an exchange that returns another number
// of addresses than tasks, an address of the wrong length.
func TestNewRefusesAJobItCannotConnect(t *testing.T) {
	d, m := openModel(t, pvsim.Config{QEMU: true})
	ctx := withTimeout(t, time.Minute)
	before := m.Objects()
	_, err := New(ctx, d, Config{Tasks: 2})
	assert.ErrorIs(t, err, errInvalid, "no Exchange")
	three := append(allAddresses(2), allAddresses(2)[1]) // each of a two-task job's length
	_, err = New(ctx, d, Config{Tasks: 2, Exchange: &fixedExchanger{all: three}})
	assert.ErrorIs(t, err, errProtocol, "three addresses for two tasks")
	assert.ErrorContains(t, err, "3 addresses for 2 tasks")
	short := allAddresses(2)
	short[1] = short[1][:len(short[1])-1]
	_, err = New(ctx, d, Config{Tasks: 2, Exchange: &fixedExchanger{all: short}})
	assert.ErrorIs(t, err, errProtocol, "an address a byte short")
	assert.Equal(t, before, m.Objects(), "what the refused calls allocated went back")
}

// SetCounter takes indices 1 to MaxCounters-1; 0 names no counter, and it
// and the indices past either end are refused with ErrCounter. A message
// with no target counter counts into none, whatever was offered at 0.
func TestSetCounterTakesIndices1ToMaxCountersLessOne(t *testing.T) {
	j := newPeerJob(t)
	c := j.c
	zero := NewCounter()
	for _, i := range []int{0, -1, MaxCounters} {
		err := c.SetCounter(i, zero)
		assert.ErrorIs(t, err, ErrCounter, "index %d", i)
		assert.Contains(t, err.Error(), fmt.Sprintf("1 to %d", MaxCounters-1))
	}
	first, last := NewCounter(), NewCounter()
	require.NoError(t, c.SetCounter(1, first))
	require.NoError(t, c.SetCounter(MaxCounters-1, last))
	j.send(t, 1, pkt(header{kind: kindEager, handler: 1, id: 0, length: 1}, []byte{1}))
	j.send(t, 1, pkt(header{kind: kindEager, handler: 1, flags: flagTgtCounter, tgtCntr: 1, id: 1, length: 1}, []byte{1}))
	j.send(t, 1, pkt(header{kind: kindEager, handler: 1, flags: flagTgtCounter, tgtCntr: MaxCounters - 1, id: 2, length: 1}, []byte{1}))
	assert.Equal(t, 3, j.ready)
	assert.Zero(t, zero.Get(), "a message without a target counter counted")
	assert.EqualValues(t, 1, first.Get())
	assert.EqualValues(t, 1, last.Get())
	require.NoError(t, c.SetCounter(1, nil), "nil unregisters")
	j.send(t, 1, pkt(header{kind: kindEager, handler: 1, flags: flagTgtCounter, tgtCntr: 1, id: 3, length: 1}, []byte{1}))
	assert.EqualValues(t, 1, first.Get(), "an unregistered counter counts nothing")
}

// SetHandler takes indices 0 to MaxHandlers-1; the indices past either
// end are refused with ErrNoHandler.
func TestSetHandlerTakesIndices0ToMaxHandlersLessOne(t *testing.T) {
	c := hostContext(t, Config{Tasks: 2})
	h := func(*Arrival) Return { return Return{} }
	for _, i := range []int{-1, MaxHandlers} {
		err := c.SetHandler(i, h)
		assert.ErrorIs(t, err, ErrNoHandler, "index %d", i)
		assert.Contains(t, err.Error(), fmt.Sprintf("0 to %d", MaxHandlers-1))
	}
	assert.NoError(t, c.SetHandler(0, h))
	assert.NoError(t, c.SetHandler(MaxHandlers-1, h))
	assert.NoError(t, c.SetHandler(MaxHandlers-1, nil), "nil unregisters")
	assert.ErrorIs(t, c.Amsend(1, MaxHandlers-1, nil, nil, Counters{}), ErrNoHandler, "an unregistered index")
}

// Purge takes the tasks 0 to Tasks-1, the last one included; a task
// past either end is refused with ErrTarget, and nothing is purged.
func TestPurgeTakesTasks0ToTasksLessOne(t *testing.T) {
	cs := newJob(t, openDevice(t), 2, Config{})
	c := cs[0]
	require.NoError(t, c.SetHandler(1, func(*Arrival) Return { return Return{} }))
	ctx := withTimeout(t, time.Minute)
	for _, tgt := range []int{-1, 2} {
		assert.ErrorIs(t, c.Purge(ctx, tgt), ErrTarget, "task %d", tgt)
	}
	for _, cn := range c.conns {
		assert.NoError(t, cn.err, "task %d purged by a refused call", cn.task)
	}
	require.NoError(t, c.Purge(ctx, 1), "the last task")
	assert.ErrorIs(t, c.Amsend(1, 1, nil, nil, Counters{}), ErrPurged)
}

// A task's first PSN is 24 bits: New connects to a task that gives
// 0xFFFFFF and refuses, allocating nothing, a job where one gives
// 0x1000000.
func TestNewTakesA24BitFirstPSNAndRefusesOneBitMore(t *testing.T) {
	d, m := openModel(t, pvsim.Config{QEMU: true})
	ctx := withTimeout(t, time.Minute) // a hang guard
	for _, tc := range []struct {
		psn uint32
		ok  bool
	}{{0xffffff, true}, {0x1000000, false}} {
		all := allAddresses(2)
		binary.LittleEndian.PutUint32(all[1][addrPSN:], tc.psn)
		before := m.Objects()
		c, err := New(ctx, d, Config{Tasks: 2, PacketSize: 256, Exchange: &fixedExchanger{all: all}})
		if tc.ok {
			require.NoError(t, err, "PSN %#x", tc.psn)
			require.NoError(t, c.Close())
			continue
		}
		require.ErrorIs(t, err, errProtocol, "PSN %#x", tc.psn)
		assert.Contains(t, err.Error(), "not 24 bits")
		assert.Equal(t, before, m.Objects(), "New undid what it made")
	}
}

// Each context sends from a random first PSN, and publishes it: QPNs are
// reused at once, and a packet of an earlier job still on the fabric must
// not fit a new job's sequence (a fixed PSN let a stale atomic answer
// complete a new QP's fetch-and-add with the old job's value).
func TestEachContextSendsFromARandomFirstPSNItPublishes(t *testing.T) {
	d, _ := openModel(t, pvsim.Config{QEMU: true})
	ctx := withTimeout(t, time.Minute) // a hang guard
	seen := map[uint32]bool{}
	for range 4 {
		x := &fixedExchanger{all: allAddresses(2)}
		c, err := New(ctx, d, Config{Tasks: 2, PacketSize: 256, Exchange: x})
		require.NoError(t, err)
		psn := addressPSN(x.mine)
		assert.Equal(t, c.psn, psn, "the address carries the context's PSN")
		assert.LessOrEqual(t, psn, uint32(0xffffff))
		seen[psn] = true
		require.NoError(t, c.Close())
	}
	assert.Len(t, seen, 4, "four contexts, four first PSNs")
}
