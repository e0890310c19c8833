package vfrdma_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

// A link-local GID from a MAC's EUI-64, and a RoCE v2 GID of an IPv4
// address (IPv4-mapped).
var (
	linkLocalGID = vfrdma.GID{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56}
	mappedGID    = vfrdma.GID{10: 0xff, 11: 0xff, 12: 10, 13: 10, 14: 0, 15: 2}
)

func TestGIDStringIsIPv6Notation(t *testing.T) {
	assert.Equal(t, "fe80::5054:ff:fe12:3456", linkLocalGID.String())
	assert.Equal(t, "::ffff:10.10.0.2", mappedGID.String())
	assert.Equal(t, "::", vfrdma.GID{}.String())
}

// What String writes, ParseGID reads back; so does the kernel's full
// colon form (sysfs .../ports/1/gids/N) and upper-case hex.
func TestParseGIDReadsStringAndTheSysfsForm(t *testing.T) {
	for _, g := range []vfrdma.GID{linkLocalGID, mappedGID, {}, {0: 0xff, 15: 1}} {
		got, err := vfrdma.ParseGID(g.String())
		require.NoError(t, err, "%s", g)
		assert.Equal(t, g, got)
	}
	for _, s := range []string{"fe80:0000:0000:0000:5054:00ff:fe12:3456", "FE80::5054:FF:FE12:3456"} {
		got, err := vfrdma.ParseGID(s)
		require.NoError(t, err, s)
		assert.Equal(t, linkLocalGID, got, s)
	}
}

// Anything that is not a GID in IPv6 notation is refused with ErrInvalid,
// and the error quotes at most a bounded part of the input.
func TestParseGIDRefusesWhatIsNotAGID(t *testing.T) {
	long := strings.Repeat("f", 1<<20)
	for _, s := range []string{
		"", "fe80", "fe80::1::2", "fe80::5054:ff:fe12:3456:1:2:3", "10.10.0.2",
		"fe80::1%eth0", "00000000000000000000ffff0a0a0002", "gggg::1", " fe80::1", long,
	} {
		_, err := vfrdma.ParseGID(s)
		require.ErrorIs(t, err, vfrdma.ErrInvalid, "%.40q", s)
		assert.Less(t, len(err.Error()), 256, "the error of a %d-byte input", len(s))
	}
	_, err := vfrdma.ParseGID("10.10.0.2")
	assert.ErrorContains(t, err, "::ffff:10.10.0.2", "the IPv4 error says how to write it")
}

// A GID is text in text encodings: JSON carries it as its IPv6 notation
// and reads it back; a bad one is an error.
func TestGIDMarshalsAsText(t *testing.T) {
	type peer struct {
		GID vfrdma.GID `json:"gid"`
	}
	b, err := json.Marshal(peer{GID: linkLocalGID})
	require.NoError(t, err)
	assert.JSONEq(t, `{"gid":"fe80::5054:ff:fe12:3456"}`, string(b))
	var p peer
	require.NoError(t, json.Unmarshal(b, &p))
	assert.Equal(t, linkLocalGID, p.GID)

	txt, err := mappedGID.MarshalText()
	require.NoError(t, err)
	var g vfrdma.GID
	require.NoError(t, g.UnmarshalText(txt))
	assert.Equal(t, mappedGID, g)

	g = linkLocalGID
	assert.ErrorIs(t, g.UnmarshalText([]byte("not a gid")), vfrdma.ErrInvalid)
	assert.Equal(t, linkLocalGID, g, "a failed UnmarshalText leaves the GID alone")
	assert.Error(t, json.Unmarshal([]byte(`{"gid":"10.0.0.1"}`), &p))
}
