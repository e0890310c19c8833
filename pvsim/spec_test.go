package pvsim_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/pvsim"
)

// A model spec names versions 17 to 20 (and not 16 or 21), vmware (20) or
// qemu, with ",rocev2" the one option; anything else is a *SpecError
// saying what is wrong.
func TestParseSpecTakesV17ToV20VMwareOrQEMUAndRoCEv2(t *testing.T) {
	for spec, want := range map[string]pvsim.Config{
		"v17": {Version: 17}, "V20": {Version: 20}, "vmware": {Version: 20},
		"qemu": {QEMU: true}, "v18,rocev2": {Version: 18, RoCEv2: true},
	} {
		got, err := pvsim.ParseSpec(spec)
		require.NoError(t, err, spec)
		assert.Equal(t, want, got, spec)
	}
	for spec, reason := range map[string]string{
		"v16": "the version is v17 to v20", "v21": "the version is v17 to v20", "vx": "the version is v17 to v20",
		"hw": "want v17..v20", "v20,fast": `unknown option "fast"`,
	} {
		_, err := pvsim.ParseSpec(spec)
		var se *pvsim.SpecError
		require.ErrorAs(t, err, &se, spec)
		assert.Contains(t, se.Reason, reason, spec)
		assert.Equal(t, spec, se.Spec)
	}
}
