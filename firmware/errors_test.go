package firmware_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/rings"
)

// A ring index the device wrote out of range is a firmware.ErrDeviceFault
// too (the driver's callers match either name): one error, two names.
func TestDeviceFaultIsOneError(t *testing.T) {
	var err error = &rings.IndexError{Ring: "CQ", Field: "prod_tail", Value: 200, Slots: 64}
	assert.ErrorIs(t, err, firmware.ErrDeviceFault)
	assert.ErrorIs(t, firmware.ErrDeviceFault, rings.ErrDeviceFault)
	assert.ErrorIs(t, rings.ErrDeviceFault, firmware.ErrDeviceFault)
}
