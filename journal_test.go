package vfrdma

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The journal lists the live objects in destroy order (users before what
// they use, bindings last), is removed when none is left, and a corrupt
// one is refused.
func TestJournalListsTheLiveObjectsInDestroyOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state") // created on the first write
	path := journalPath(dir, "0000:00:10.1")
	assert.Equal(t, "objects-0000_00_10.1.json", filepath.Base(path))
	j := journal{path: path}
	j.add(kindBind, 0)
	j.add(kindPD, 1)
	j.add(kindCQ, 2)
	j.add(kindQP, 77)
	j.add(kindMR, 3)
	j.remove(kindCQ, 2)
	j.remove(kindCQ, 9) // not there: nothing happens
	require.NoError(t, j.err)
	left, err := readJournal(path)
	require.NoError(t, err)
	want := []journalEntry{{kindQP, 77}, {kindMR, 3}, {kindPD, 1}, {kindBind, 0}}
	assert.Equal(t, want, left)
	for _, e := range want {
		j.remove(e.Kind, e.Handle)
	}
	_, err = os.Stat(path)
	assert.ErrorIs(t, err, os.ErrNotExist, "an empty journal is removed")
	left, err = readJournal(path)
	assert.NoError(t, err)
	assert.Nil(t, left, "no file")
	left, err = readJournal("")
	assert.NoError(t, err)
	assert.Nil(t, left, "a disabled journal")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(path, []byte("{garbage"), 0o600))
	_, err = readJournal(path)
	assert.Error(t, err, "a corrupt journal accepted")
}

func TestJournalDisabled(t *testing.T) {
	var j journal // no path: a no-op
	j.add(kindPD, 1)
	j.remove(kindPD, 1)
	assert.NoError(t, j.err)
	assert.Nil(t, j.live)
	o := (&Options{StateDir: "-"}).withDefaults()
	assert.Empty(t, o.StateDir, `StateDir "-"`)
	o = (*Options)(nil).withDefaults()
	assert.Equal(t, DefaultStateDir, o.StateDir)
	assert.Equal(t, DefaultCommandTimeout, o.CommandTimeout)
	assert.NotNil(t, o.Logger)
}

// Whatever the changes, the file read back lists exactly the live objects
// (a handle added twice and removed once stays listed once), appended
// records and compactions alike.
func TestJournalReadBackMatchesTheLiveObjects(t *testing.T) {
	path := journalPath(t.TempDir(), "0000:00:10.1")
	j := journal{path: path}
	kinds := []string{kindQP, kindSRQ, kindCQ, kindMR, kindPD, kindBind}
	rng := rand.New(rand.NewPCG(5, 6))
	var live []journalEntry
	for step := 0; step < 3000; step++ {
		if len(live) == 0 || rng.IntN(100) < 55 {
			e := journalEntry{kinds[rng.IntN(len(kinds))], uint32(rng.IntN(40))}
			j.add(e.Kind, e.Handle)
			live = append(live, e)
		} else {
			i := rng.IntN(len(live))
			j.remove(live[i].Kind, live[i].Handle)
			live = append(live[:i], live[i+1:]...)
		}
		if step%97 != 0 {
			continue
		}
		got, err := readJournal(path)
		require.NoError(t, err, "step %d", step)
		want := slices.Clone(live)
		order := func(a, b journalEntry) int {
			if d := slices.Index(destroyOrder, a.Kind) - slices.Index(destroyOrder, b.Kind); d != 0 {
				return d
			}
			return int(a.Handle) - int(b.Handle)
		}
		slices.SortFunc(want, order)
		slices.SortStableFunc(got, order) // readJournal orders by kind only
		require.Equal(t, want, got, "step %d", step)
	}
	require.NoError(t, j.err)
}

// A change appends one record; the file is compacted into a snapshot once
// the records reach the live objects plus compactSlack: 100 adds append
// 99 records after the first snapshot, then the i-th remove one more
// while 99+(i-1) < 100-i+compactSlack (up to i = compactSlack/2), and the
// next one compacts.
func TestJournalIsCompactedWhenRecordsReachTheLiveObjectsPlusSlack(t *testing.T) {
	path := journalPath(t.TempDir(), "0000:00:10.1")
	j := journal{path: path}
	lines := func() int {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return bytes.Count(b, []byte("\n"))
	}
	for h := range uint32(100) {
		j.add(kindQP, h)
	}
	assert.Equal(t, 100, lines(), "one snapshot line, 99 records")
	last := compactSlack / 2
	for h := range uint32(last) {
		j.remove(kindQP, h)
	}
	assert.Equal(t, 100+last, lines(), "at the limit: still appended")
	j.remove(kindQP, uint32(last))
	assert.Equal(t, 1, lines(), "one past: compacted")
	left, err := readJournal(path)
	require.NoError(t, err)
	assert.Len(t, left, 100-last-1)
	j.remove(kindQP, 99)
	assert.Equal(t, 2, lines(), "appending again after the snapshot")
	require.NoError(t, j.err)
}

// Each change writes amortized O(1) bytes however many objects live: n
// objects added and removed write a bounded number of bytes per change (a
// journal rewritten whole on every change writes about n² entries).
func TestJournalWritesBoundedBytesPerChange(t *testing.T) {
	const n = 1000
	path := journalPath(t.TempDir(), "0000:00:10.1")
	j := journal{path: path}
	written, prev := 0, 0
	note := func() {
		b, err := os.ReadFile(path)
		if os.IsNotExist(err) {
			prev = 0
			return
		}
		require.NoError(t, err)
		if len(b) > prev && bytes.Count(b, []byte("\n")) > 1 {
			written += len(b) - prev // a record appended
		} else {
			written += len(b) // a new snapshot
		}
		prev = len(b)
	}
	for h := range uint32(n) {
		j.add(kindQP, 0x10000+h)
		note()
	}
	for h := range uint32(n) {
		j.remove(kindQP, 0x10000+h)
		note()
	}
	rec, _ := json.Marshal(journalRecord{Remove: &journalEntry{kindQP, 0x10000}})
	t.Logf("%d changes wrote %d bytes; a record is %d", 2*n, written, len(rec)+1)
	assert.LessOrEqual(t, written, 4*2*n*(len(rec)+1))
	require.NoError(t, j.err)
}

// A last record cut short (the holder died while appending it) is
// ignored; a record that is not JSON, or names neither an add nor a
// remove, before the end makes the journal corrupt. The format of a file
// with no records (a snapshot alone) is the journal's first format.
func TestJournalIgnoresACutLastRecordAndRefusesACorruptOne(t *testing.T) {
	path := journalPath(t.TempDir(), "0000:00:10.1")
	snapshot := `{"pid":1,"objects":[{"kind":"qp","handle":7},{"kind":"pd","handle":1}]}`
	add := `{"add":{"kind":"cq","handle":3}}` + "\n"
	for _, tc := range []struct {
		name, text string
		want       []journalEntry
		corrupt    bool
	}{
		{"a snapshot alone, no newline", snapshot, []journalEntry{{kindQP, 7}, {kindPD, 1}}, false},
		{"records", snapshot + "\n" + add + `{"remove":{"kind":"qp","handle":7}}` + "\n", []journalEntry{{kindCQ, 3}, {kindPD, 1}}, false},
		{"a cut last record", snapshot + "\n" + add + `{"add":{"kind":"qp","ha`, []journalEntry{{kindQP, 7}, {kindCQ, 3}, {kindPD, 1}}, false},
		{"a remove of what is not there", snapshot + "\n" + `{"remove":{"kind":"mr","handle":7}}` + "\n", []journalEntry{{kindQP, 7}, {kindPD, 1}}, false},
		{"garbage before the end", snapshot + "\n" + "xx\n" + add, nil, true},
		{"an empty record", snapshot + "\n{}\n", nil, true},
		{"a record of both", snapshot + "\n" + `{"add":{"kind":"cq","handle":3},"remove":{"kind":"cq","handle":3}}` + "\n", nil, true},
		{"a cut snapshot", snapshot[:20], nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, []byte(tc.text), 0o600))
			got, err := readJournal(path)
			if tc.corrupt {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// A journal whose file went away under it (removed by hand) writes a new
// snapshot at its next change instead of losing the objects.
func TestJournalWritesASnapshotWhenItsFileIsGone(t *testing.T) {
	path := journalPath(t.TempDir(), "0000:00:10.1")
	j := journal{path: path}
	j.add(kindPD, 1)
	j.add(kindCQ, 2)
	require.NoError(t, os.Remove(path))
	j.add(kindQP, 3)
	left, err := readJournal(path)
	require.NoError(t, err)
	assert.Equal(t, []journalEntry{{kindQP, 3}, {kindCQ, 2}, {kindPD, 1}}, left)
	assert.Error(t, j.err, "the failed append is reported")
	assert.Contains(t, fmt.Sprint(j.err), path)
}

func TestGIDString(t *testing.T) {
	g := GID{0xfe, 0x80, 8: 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56}
	assert.Equal(t, "fe80::5054:ff:fe12:3456", g.String())
}

// When the last live object goes the journal's file goes with it, and the
// next object starts a new file without a failed append: emptying is not
// an error, and the new file lists just the new object.
func TestAJournalEmptiedAndFilledAgainStartsANewFileWithoutAnError(t *testing.T) {
	path := journalPath(t.TempDir(), "0000:00:10.1")
	j := journal{path: path}
	for round := range 3 {
		j.add(kindPD, 1)
		j.add(kindCQ, 2)
		j.remove(kindCQ, 2)
		j.remove(kindPD, 1)
		assert.NoFileExists(t, path, "round %d: an empty journal has no file", round)
		j.add(kindQP, uint32(10+round))
		require.NoError(t, j.err, "round %d", round)
		left, err := readJournal(path)
		require.NoError(t, err)
		assert.Equal(t, []journalEntry{{kindQP, uint32(10 + round)}}, left, "round %d", round)
		j.remove(kindQP, uint32(10+round))
	}
}
