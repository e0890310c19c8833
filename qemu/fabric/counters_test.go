package fabric

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// counterFile lays out a counters file as the backend does (stats.c).
func counterFile(cs ...Counter) []byte {
	b := make([]byte, countersHdr+len(cs)*counterEntry)
	copy(b, countersMagic)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(cs)))
	for i, c := range cs {
		e := b[countersHdr+i*counterEntry:]
		copy(e[:counterName-1], c.Name)
		binary.LittleEndian.PutUint64(e[counterName:], c.Value)
	}
	return b
}

func TestCountersReadsTheBackendsFile(t *testing.T) {
	d := Dir(t.TempDir())
	want := []Counter{{"ud_sent", 7}, {"drop_no_recv", 1}, {"drop_qkey", 0}}
	require.NoError(t, os.MkdirAll(filepath.Join(string(d), "stats"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(string(d), "stats", "vm0"), counterFile(want...), 0o644))
	got, err := d.Counters("vm0")
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Equal(t, "drop_no_recv=1 ud_sent=7", FormatCounters(got), "drops first, zeros left out")
}

func TestCountersOfANodeThatNeverCameUp(t *testing.T) {
	_, err := Dir(t.TempDir()).Counters("vm3")
	assert.ErrorIs(t, err, ErrNoCounters)
}

func TestCountersRefusesABadFile(t *testing.T) {
	good := counterFile(Counter{"ud_sent", 1})
	for name, b := range map[string][]byte{
		"short":        good[:10],
		"bad magic":    append([]byte("SVSTATS9"), good[8:]...),
		"count beyond": good[:len(good)-1],
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseCounters(b)
			assert.Error(t, err)
		})
	}
	_, err := Dir(t.TempDir()).Counters("../x")
	assert.Error(t, err, "a node name is checked before it makes a path")
}

func TestFormatCountersWithoutDrops(t *testing.T) {
	assert.Equal(t, "no drops ud_sent=3", FormatCounters([]Counter{{"ud_sent", 3}, {"drop_qkey", 0}}))
}
