package pvsim_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
	"github.com/vfrdma/vfrdma/rings"
)

// queryState is QUERY_QP's qp_state for q.
func queryState(t *testing.T, q *rawQP) firmware.QPState {
	t.Helper()
	r, err := q.r.ch.QueryQP(q.r.ctx(), q.handle, firmware.QPAttrState)
	require.NoError(t, err)
	return r.QPState
}

// QUERY_QP answers the state the device moved a QP to: after an RDMA READ
// with an rkey the responder never issued, ERR for the requester (told by
// its completion only) and for the responder (QP_ACCESS_ERR).
func TestQueryQPAnswersERRAfterAReadsRemoteAccessError(t *testing.T) {
	for _, tc := range vmware {
		t.Run(tc.name, func(t *testing.T) {
			p := newRCPair(t, tc.cfg, defaultRC(), defaultRC())
			p.a.send(rdma(1, rings.WRRDMARead, p.amr.sge(0, 64), p.bmr.addr(0), p.bmr.rkey^0x5a5a))
			assert.Equal(t, uint32(rings.WCRemAccessErr), p.acq.wait(1)[0].Status)
			p.r.waitEvent(firmware.EventQPAccessErr)
			assert.Equal(t, firmware.QPStateErr, queryState(t, p.a), "the requester")
			assert.Equal(t, firmware.QPStateErr, queryState(t, p.b), "the responder")
		})
	}
}

// On QEMU, QUERY_QP answers its backend QP's state: a message longer than
// the receive it lands in fails both backend QPs, and both read ERR.
func TestQueryQPAnswersTheBackendsERRAfterAShortReceiveOnQEMU(t *testing.T) {
	p := newRCPair(t, pvsim.Config{QEMU: true}, defaultRC(), defaultRC())
	p.b.recv(1, p.bmr.sge(0, 10))
	p.a.send(sendWR(2, rings.WRSend, sig, p.amr.sge(0, 100)))
	assert.Equal(t, uint32(rings.WCLocLenErr), p.bcq.wait(1)[0].Status)
	assert.NotEqual(t, uint32(rings.WCSuccess), p.acq.wait(1)[0].Status)
	assert.Equal(t, firmware.QPStateErr, queryState(t, p.a), "the sender")
	assert.Equal(t, firmware.QPStateErr, queryState(t, p.b), "the receiver")
}
