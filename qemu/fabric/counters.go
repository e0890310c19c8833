package fabric

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The backend counts, per node, what the fabric dropped or refused, by
// reason, in <dir>/stats/<node>: a file it keeps mapped while it runs, so
// the counts can be read during a run and after the process was killed.
// Layout (little endian): "SVSTATS1", u32 N, u32 0, then N entries of a
// NUL-padded 24-byte name and a u64 value.
const (
	countersMagic = "SVSTATS1"
	countersHdr   = 16
	counterName   = 24
	counterEntry  = counterName + 8
	maxCounters   = 256
)

// ErrNoCounters is returned for a node that never came up on the fabric.
var ErrNoCounters = errors.New("fabric: no counters for that node")

// Counter is one of a node's backend counters.
type Counter struct {
	Name  string
	Value uint64
}

// Drop reports whether the counter counts messages the fabric lost
// (a datagram dropped, by reason) rather than traffic or protocol events.
func (c Counter) Drop() bool { return strings.HasPrefix(c.Name, "drop_") }

// Counters returns a node's backend counters, in the backend's order.
func (d Dir) Counters(node string) ([]Counter, error) {
	if !nodeName.MatchString(node) {
		return nil, fmt.Errorf("fabric: bad node name %q", node)
	}
	b, err := os.ReadFile(filepath.Join(string(d), "stats", node))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w %s", ErrNoCounters, node)
	}
	if err != nil {
		return nil, fmt.Errorf("fabric: %w", err)
	}
	return parseCounters(b)
}

func parseCounters(b []byte) ([]Counter, error) {
	if len(b) < countersHdr || string(b[:8]) != countersMagic {
		return nil, errors.New("fabric: counters file: bad header")
	}
	n := int(binary.LittleEndian.Uint32(b[8:]))
	if n > maxCounters || countersHdr+n*counterEntry > len(b) {
		return nil, fmt.Errorf("fabric: counters file: %d counters in %d bytes", n, len(b))
	}
	out := make([]Counter, n)
	for i := range out {
		e := b[countersHdr+i*counterEntry:]
		name, _, _ := bytes.Cut(e[:counterName], []byte{0})
		out[i] = Counter{Name: string(name), Value: binary.LittleEndian.Uint64(e[counterName:])}
	}
	return out, nil
}

// FormatCounters lists the non-zero counters as "name=value" words; the
// drops first, since they are what a post-mortem looks for.
func FormatCounters(cs []Counter) string {
	var drops, rest []string
	for _, c := range cs {
		if c.Value == 0 {
			continue
		}
		w := fmt.Sprintf("%s=%d", c.Name, c.Value)
		if c.Drop() {
			drops = append(drops, w)
		} else {
			rest = append(rest, w)
		}
	}
	if len(drops) == 0 {
		drops = []string{"no drops"}
	}
	return strings.Join(append(drops, rest...), " ")
}
