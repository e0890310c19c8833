// Package devfault holds the one sentinel error for a device that broke its
// protocol. The packages that read what the device writes (firmware: command
// responses, capabilities; rings: ring indices) each export it under their
// own name, firmware.ErrDeviceFault and rings.ErrDeviceFault, without
// either importing the other, so errors.Is matches a fault from either
// against both (and against vfrdma.ErrDeviceFault).
package devfault

import "errors"

// Err reports something the device wrote that cannot be right.
var Err = errors.New("pvrdma: device fault")
