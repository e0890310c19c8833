package vfrdma

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// Object kinds in the journal, in the order leftovers are destroyed: users
// before what they use.
const (
	kindQP   = "qp"
	kindSRQ  = "srq"
	kindCQ   = "cq"
	kindMR   = "mr"
	kindPD   = "pd"
	kindBind = "bind" // a GID table index
)

var destroyOrder = []string{kindQP, kindSRQ, kindCQ, kindMR, kindPD, kindBind}

type journalEntry struct {
	Kind   string `json:"kind"`
	Handle uint32 `json:"handle"`
}

// journal keeps the device handles of live objects in a file, so that the
// next Open after a crash can destroy what a killed process left on the
// device. The file is a snapshot (a journalFile, written whole to a
// temporary file and renamed into place) followed by one journalRecord a
// line per change since: a change appends one line, and the file is
// compacted into a new snapshot once the records outnumber the live
// objects (plus compactSlack), so each change costs amortized O(1) however
// many objects live. It is control-path only. A journal with no path does
// nothing.
type journal struct {
	path     string
	mu       sync.Mutex
	live     map[journalEntry]int // live objects, each with how often it was added and not removed
	n        int                  // the sum of live's counts
	appended int                  // records after the file's snapshot; -1: no file
	err      error                // the first write failure, reported by Close
}

// compactSlack is how many records beyond the live objects the file may
// hold before it is compacted: a small journal is not rewritten on every
// change.
const compactSlack = 32

type journalFile struct {
	PID     int            `json:"pid"`
	Objects []journalEntry `json:"objects"`
}

// journalRecord is one change after the snapshot: an object added or
// removed.
type journalRecord struct {
	Add    *journalEntry `json:"add,omitempty"`
	Remove *journalEntry `json:"remove,omitempty"`
}

func journalPath(dir, dev string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, "objects-"+strings.ReplaceAll(dev, ":", "_")+".json")
}

// readJournal returns the leftovers a previous holder of the device
// recorded, in destroy order: its snapshot with the records after it
// applied. A last record cut short (the process died while appending it)
// is ignored: the change it was recording had just been made on the
// device, a window the journal has anyway.
func readJournal(path string) ([]journalEntry, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var f journalFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("journal %s: %w", path, err)
	}
	count := map[journalEntry]int{}
	var order []journalEntry // each entry once, in the order first added
	add := func(e journalEntry) {
		if _, seen := count[e]; !seen {
			order = append(order, e)
		}
		count[e]++
	}
	for _, e := range f.Objects {
		add(e)
	}
	for i := 1; ; i++ {
		var r journalRecord
		err := dec.Decode(&r)
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		switch {
		case err != nil:
			return nil, fmt.Errorf("journal %s: record %d: %w", path, i, err)
		case (r.Add == nil) == (r.Remove == nil):
			return nil, fmt.Errorf("journal %s: record %d: not one add or one remove", path, i)
		case r.Add != nil:
			add(*r.Add)
		case count[*r.Remove] > 0:
			count[*r.Remove]--
		}
	}
	var out []journalEntry
	for _, e := range order {
		for range count[e] {
			out = append(out, e)
		}
	}
	slices.SortStableFunc(out, func(a, b journalEntry) int {
		return slices.Index(destroyOrder, a.Kind) - slices.Index(destroyOrder, b.Kind)
	})
	return out, nil
}

func (j *journal) add(kind string, h uint32) {
	if j.path == "" {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	e := journalEntry{kind, h}
	if j.live == nil {
		j.live, j.appended = map[journalEntry]int{}, -1
	}
	j.live[e]++
	j.n++
	j.recordLocked(journalRecord{Add: &e})
}

func (j *journal) remove(kind string, h uint32) {
	if j.path == "" {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	e := journalEntry{kind, h}
	if j.live[e] == 0 {
		return
	}
	if j.live[e]--; j.live[e] == 0 {
		delete(j.live, e)
	}
	j.n--
	if j.n == 0 {
		j.appended = -1
		if err := os.Remove(j.path); err != nil && !errors.Is(err, os.ErrNotExist) && j.err == nil {
			j.err = err
		}
		return
	}
	j.recordLocked(journalRecord{Remove: &e})
}

// recordLocked appends r to the file, or writes a new snapshot when there
// is no file yet or the records outnumber the live objects.
func (j *journal) recordLocked(r journalRecord) {
	if j.appended >= 0 && j.appended < j.n+compactSlack {
		err := j.appendLocked(r)
		if err == nil {
			j.appended++
			return
		}
		if j.err == nil {
			j.err = fmt.Errorf("journal %s: %w", j.path, err)
		}
	}
	j.compactLocked()
}

func (j *journal) appendLocked(r journalRecord) error {
	b, _ := json.Marshal(r)
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	return errors.Join(err, f.Close())
}

// compactLocked replaces the file with a snapshot of the live objects.
func (j *journal) compactLocked() {
	objs := make([]journalEntry, 0, j.n)
	for e, c := range j.live {
		for range c {
			objs = append(objs, e)
		}
	}
	slices.SortFunc(objs, func(a, b journalEntry) int {
		if d := slices.Index(destroyOrder, a.Kind) - slices.Index(destroyOrder, b.Kind); d != 0 {
			return d
		}
		return cmp.Compare(a.Handle, b.Handle)
	})
	b, _ := json.Marshal(journalFile{PID: os.Getpid(), Objects: objs})
	tmp := j.path + ".tmp"
	err := os.MkdirAll(filepath.Dir(j.path), 0o755)
	if err == nil {
		err = os.WriteFile(tmp, append(b, '\n'), 0o600)
	}
	if err == nil {
		err = os.Rename(tmp, j.path)
	}
	if err != nil {
		j.appended = -1 // the next change tries a snapshot again
		if j.err == nil {
			j.err = fmt.Errorf("journal %s: %w", j.path, err)
		}
		return
	}
	j.appended = 0
}
