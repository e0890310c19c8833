//go:build guest

package vfrdma

import "testing"

// The data-path suite (datapath_suite_test.go) on QEMU's device.

func TestRCStream(t *testing.T) { suiteRCStream(t, openGuest(t)) }

func TestUDStream(t *testing.T) { suiteUDStream(t, openGuest(t)) }

func TestDeferredPosts(t *testing.T) { suiteDeferredPosts(t, openGuest(t)) }

func TestExactlyOnce(t *testing.T) { suiteExactlyOnce(t, openGuest(t)) }

func TestWaitCQ(t *testing.T) { suiteWaitCQ(t, openGuest(t)) }

func TestAFailedRCQPIsInERRInStateAndOnTheDevice(t *testing.T) {
	suiteAFailedRCQPIsInERRInStateAndOnTheDevice(t, openGuest(t))
}

func TestUnsignaledSendsCompleteOnTime(t *testing.T) {
	suiteUnsignaledSendsCompleteOnTime(t, openGuest(t))
}

func TestFlushesFollowTheDevicesCompletionsAcrossShortPolls(t *testing.T) {
	suiteFlushesFollowTheDevicesCompletionsAcrossShortPolls(t, openGuest(t))
}

func TestCloseFlushesEachSendOutstandingOnceFromOneToTheQueueDepth(t *testing.T) {
	suiteCloseFlushesEachSendOutstandingOnceFromOneToTheQueueDepth(t, openGuest(t))
}

func TestRegisterMRAtCarriesUnalignedMemoryByteForByte(t *testing.T) {
	suiteRegisterMRAtCarriesUnalignedMemoryByteForByte(t, openGuest(t))
}
