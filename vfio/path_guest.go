//go:build guest

package vfio

import "os"

// In the bench's guest builds (build tag guest: the in-guest tests and the
// tools the guest runs), VFRDMA_VFIO ("auto", "cdev" or "group") says what
// Options.Path PathAuto means, so that a tier chooses the path for every
// Open in the guest, its tests' included, through one variable. An explicit
// Options.Path wins; a value that is none of the three fails Open.
var envPath = os.Getenv(envPathVar)

// envPathVar is the variable: the bench's manifest sets it on a step
// (guest.Step.Env).
const envPathVar = "VFRDMA_VFIO"
