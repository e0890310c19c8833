package vfrdma

import (
	"encoding/json"
	"errors"
	"fmt"
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
// device. The file is rewritten whole, atomically, on every change; it is
// control-path only. A journal with no path does nothing.
type journal struct {
	path string
	mu   sync.Mutex
	live []journalEntry
	err  error // the first write failure, reported by Close
}

type journalFile struct {
	PID     int            `json:"pid"`
	Objects []journalEntry `json:"objects"`
}

func journalPath(dir, dev string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, "objects-"+strings.ReplaceAll(dev, ":", "_")+".json")
}

// readJournal returns the leftovers a previous holder of the device
// recorded, in destroy order.
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
	var f journalFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("journal %s: %w", path, err)
	}
	out := slices.Clone(f.Objects)
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
	j.live = append(j.live, journalEntry{kind, h})
	j.flushLocked()
}

func (j *journal) remove(kind string, h uint32) {
	if j.path == "" {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if i := slices.Index(j.live, journalEntry{kind, h}); i >= 0 {
		j.live = slices.Delete(j.live, i, i+1)
	}
	j.flushLocked()
}

func (j *journal) flushLocked() {
	if len(j.live) == 0 {
		if err := os.Remove(j.path); err != nil && !errors.Is(err, os.ErrNotExist) && j.err == nil {
			j.err = err
		}
		return
	}
	b, _ := json.Marshal(journalFile{PID: os.Getpid(), Objects: j.live})
	tmp := j.path + ".tmp"
	err := os.MkdirAll(filepath.Dir(j.path), 0o755)
	if err == nil {
		err = os.WriteFile(tmp, b, 0o600)
	}
	if err == nil {
		err = os.Rename(tmp, j.path)
	}
	if err != nil && j.err == nil {
		j.err = fmt.Errorf("journal %s: %w", j.path, err)
	}
}
