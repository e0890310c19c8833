package vfrdma

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/vfrdma/vfrdma/firmware"
)

// A PortState is the device's number for the state (QUERY_PORT's state,
// the verbs' numbering), and String names each one as the verbs write it;
// a number past the last state is written as a number.
func TestPortStateIsTheDevicesNumberAndNamesEachState(t *testing.T) {
	for _, tc := range []struct {
		s    PortState
		num  uint32
		name string
	}{
		{PortNOP, firmware.PortNop, "PORT_NOP"},
		{PortDown, firmware.PortDown, "PORT_DOWN"},
		{PortInit, firmware.PortInit, "PORT_INIT"},
		{PortArmed, firmware.PortArmed, "PORT_ARMED"},
		{PortActive, firmware.PortActive, "PORT_ACTIVE"},
		{PortActiveDefer, firmware.PortActiveDefer, "PORT_ACTIVE_DEFER"},
		{PortActiveDefer + 1, 6, "PortState(6)"},
	} {
		assert.Equal(t, tc.num, uint32(tc.s), tc.name)
		assert.Equal(t, tc.name, tc.s.String())
	}
}
