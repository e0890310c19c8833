package vfrdma

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A completion with an error status, polled, puts an RC QP in ERR (the
// verbs' rule), on the send queue and the receive queue alike; QEMU's own
// GENERAL_ERR does not (QEMU fails the request itself and its QP runs on),
// a VMware device's does; a UD QP's state is left to the device.
func TestAnErrorCompletionPutsAnRCQPInERRButNotQEMUsGeneralErr(t *testing.T) {
	for _, typ := range []QPType{RC, UD} {
		for _, emulated := range []bool{true, false} {
			for _, send := range []bool{true, false} {
				if typ == UD && send {
					continue // a datagram needs an address: the receive shows the rule
				}
				for _, st := range []WCStatus{WCSuccess, WCLocLenErr, WCFlushErr, WCRemAccessErr, WCGeneral} {
					name := fmt.Sprintf("%v/emulated=%v/send=%v/%v", typ, emulated, send, st)
					t.Run(name, func(t *testing.T) {
						f := newFixture(t, typ, 8)
						f.d.emulated = emulated
						var err error
						if send {
							_, err = f.qp.PostSend([]SendWR{{WRID: 1, SGEs: []SGE{f.sge(0, 16)}}}, 0)
						} else {
							_, err = f.qp.PostRecv([]RecvWR{{WRID: 1, SGEs: []SGE{f.sge(0, 64)}}}, 0)
						}
						require.NoError(t, err)
						require.Equal(t, 1, f.device(t, uint32(st)))
						wcs := make([]WC, 4)
						n, err := f.cq.Poll(wcs)
						require.NoError(t, err)
						require.Equal(t, 1, n)
						require.Equal(t, st, wcs[0].Status)
						want := StateRTS
						if typ == RC && st != WCSuccess && (st != WCGeneral || !emulated) {
							want = StateErr
						}
						assert.Equal(t, want, f.qp.State())
					})
				}
			}
		}
	}
}

// The device's answer to a query replaces State, except that an ERR stays:
// one the driver knew before it asked (ERR is final), and one it learned
// while the command ran (an event or a completion meanwhile).
func TestAQueryAnswerNeverTakesStateOutOfERR(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		before, meantime, now QPState
		want                  QPState
	}{
		{"RTS, the device says RTS", StateRTS, StateRTS, StateRTS, StateRTS},
		{"RTS, the device says ERR", StateRTS, StateRTS, StateErr, StateErr},
		{"RTS, the device says SQE", StateRTS, StateRTS, StateSQE, StateSQE},
		{"RTS, ERR learned meanwhile, the device says RTS", StateRTS, StateErr, StateRTS, StateErr},
		{"ERR, the device says RTS", StateErr, StateErr, StateRTS, StateErr},
		{"ERR, the device says RESET", StateErr, StateErr, StateReset, StateErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qp := &QP{}
			qp.state.Store(uint32(tc.meantime))
			qp.learn(tc.before, tc.now)
			assert.Equal(t, tc.want, qp.State())
		})
	}
}

// The states a device can name have their verbs names.
func TestQPStatesPrintTheirVerbsNames(t *testing.T) {
	for st, want := range map[QPState]string{StateReset: "RESET", StateInit: "INIT", StateRTR: "RTR", StateRTS: "RTS",
		StateSQD: "SQD", StateSQE: "SQE", StateErr: "ERR", 7: "QPState(7)"} {
		assert.Equal(t, want, st.String())
	}
}
