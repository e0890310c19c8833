package vfrdma

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma/pvsim"
)

// The data-path suite (datapath_suite_test.go) on the device model's QEMU
// 7.2 mode: the in-guest run of the same suite on QEMU keeps the model
// honest.
func TestDataPathSuiteOnTheQEMUModel(t *testing.T) {
	runDataPathSuiteOnModel(t, pvsim.Config{QEMU: true})
}

// The data-path suite on the model of VMware's device at interface version
// 20, which honours signaling and names QPs by handles of their own.
func TestDataPathSuiteOnTheVersion20Model(t *testing.T) {
	runDataPathSuiteOnModel(t, pvsim.Config{Version: pvsim.VersionQPHandle})
}

func runDataPathSuiteOnModel(t *testing.T, cfg pvsim.Config) {
	defer func(n int) { streamMessages = n }(streamMessages)
	streamMessages = 10000
	for _, tc := range dataPathSuite {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, openSuiteModel(t, cfg)) })
	}
}

// openSuiteModel opens the driver on a new model; the test closes it.
func openSuiteModel(t *testing.T, cfg pvsim.Config) *Device {
	t.Helper()
	m, err := pvsim.New(cfg)
	require.NoError(t, err)
	d, err := OpenFunction(m, nil)
	if err != nil {
		m.Close()
		require.NoError(t, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// The send-side rules of the suite on a version 20 model that advances a
// send queue's consumer index when a request completes rather than when it
// fetches it (which one VMware's device does is not known): unsignaled
// sends are retired on time either way, and Close flushes each send left
// once.
func TestSendRulesWhenTheDeviceConsumesSendsOnCompletion(t *testing.T) {
	cfg := pvsim.Config{Version: pvsim.VersionQPHandle, SQConsumeOnCompletion: true}
	for _, tc := range dataPathSuite {
		switch tc.name {
		case "UnsignaledSendsCompleteOnTime", "FlushesFollowTheDevicesCompletionsAcrossShortPolls", "CloseFlushesEachSendOutstandingOnceFromOneToTheQueueDepth":
		default:
			continue
		}
		t.Run(tc.name, func(t *testing.T) { tc.run(t, openSuiteModel(t, cfg)) })
	}
}
