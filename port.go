package vfrdma

import (
	"context"
	"fmt"

	"github.com/vfrdma/vfrdma/firmware"
)

// PortAttr are a port's attributes (QUERY_PORT). Its State is a PortState's
// number: PortState(attr.State) names it.
type PortAttr = firmware.PortAttr

// PortState is a port's state (enum pvrdma_port_state, the verbs'
// ibv_port_state numbering).
type PortState uint32

// Port states.
const (
	PortNOP         PortState = firmware.PortNop
	PortDown        PortState = firmware.PortDown
	PortInit        PortState = firmware.PortInit
	PortArmed       PortState = firmware.PortArmed
	PortActive      PortState = firmware.PortActive
	PortActiveDefer PortState = firmware.PortActiveDefer
)

// String returns the state as the verbs write it ("PORT_ACTIVE"), or
// "PortState(n)" for a number no state has.
func (s PortState) String() string {
	switch s {
	case PortNOP:
		return "PORT_NOP"
	case PortDown:
		return "PORT_DOWN"
	case PortInit:
		return "PORT_INIT"
	case PortArmed:
		return "PORT_ARMED"
	case PortActive:
		return "PORT_ACTIVE"
	case PortActiveDefer:
		return "PORT_ACTIVE_DEFER"
	}
	return fmt.Sprintf("PortState(%d)", uint32(s))
}

// PortState returns port 1's state as the driver last learned it: from
// QUERY_PORT at Open, then from the device's PORT_ACTIVE and PORT_ERR
// events (PORT_ERR reads PortDown).
func (d *Device) PortState() PortState { return PortState(d.portState.Load()) }

// QueryPort returns the attributes of port 1, the device's only port.
func (d *Device) QueryPort(ctx context.Context) (PortAttr, error) {
	if err := d.enter(); err != nil {
		return PortAttr{}, d.opErr("query port", err)
	}
	defer d.exit()
	p, err := d.ch.QueryPort(ctx, 1)
	return p, d.opErr("query port", err)
}
