// Package fabric writes GID registrations into the software RDMA backend's
// fabric directory (qemu/softverbs; its README is the contract).
//
// Every process that loads the backend with the same SOFTVERBS_FABRIC
// directory is on one fabric. Each is a node, named by SOFTVERBS_NODE. A
// node's GID table holds a placeholder at index 0, the node's own default GID
// at index 1, and from index 2 the GIDs registered here: the guest's
// CREATE_BIND reaches the bench's MAD mux as a REG message, and the mux
// registers that GID for the QEMU process it serves, so that the backend can
// resolve the guest's GID (QEMU rejects backend index 0) and route traffic to
// it by GID.
//
// Files, all written atomically (temporary file, then rename):
//
//	<dir>/node/<node>/gid.<N>   32 hex digits + "\n": the GID at index N ≥ 2
//	<dir>/gid/<32 hex digits>   node name + "\n": which node owns the GID
//
// A Dir is safe for use by one writer per node; two writers for the same node
// must serialise themselves (the mux does: QEMU waits for each reply).
package fabric

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// DefaultDir is the backend's default fabric directory.
const DefaultDir = "/tmp/softverbs"

// FirstIndex is the first GID index registrations use; 0 is the backend's
// placeholder and 1 the node's own GID.
const FirstIndex = 2

// MaxIndex bounds the indices this package hands out (the backend reports a
// larger table; the bench needs a handful).
const MaxIndex = 127

// ErrTableFull is returned when a node has no free GID index left.
var ErrTableFull = errors.New("fabric: GID table full")

var nodeName = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// GID is a 16-byte RoCE/IB global identifier in network byte order.
type GID [16]byte

// String returns the GID in IPv6 notation.
func (g GID) String() string { return netip.AddrFrom16(g).String() }

func (g GID) hex() string { return hex.EncodeToString(g[:]) }

// Dir is a fabric directory.
type Dir string

func (d Dir) nodeDir(node string) (string, error) {
	if !nodeName.MatchString(node) {
		return "", fmt.Errorf("fabric: bad node name %q (want [A-Za-z0-9_.-]+)", node)
	}
	return filepath.Join(string(d), "node", node), nil
}

// Register gives gid an index in node's GID table and routes it to node. A
// GID already registered for node keeps its index. The index is returned.
func (d Dir) Register(node string, gid GID) (int, error) {
	nd, err := d.nodeDir(node)
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(nd, 0o755); err != nil {
		return 0, fmt.Errorf("fabric: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(string(d), "gid"), 0o755); err != nil {
		return 0, fmt.Errorf("fabric: %w", err)
	}
	table, err := d.Table(node)
	if err != nil {
		return 0, err
	}
	idx := 0
	for i, g := range table {
		if g == gid {
			idx = i
			break
		}
	}
	if idx == 0 {
		for i := FirstIndex; i <= MaxIndex; i++ {
			if _, used := table[i]; !used {
				idx = i
				break
			}
		}
	}
	if idx == 0 {
		return 0, fmt.Errorf("%w: node %s has %d registered GIDs", ErrTableFull, node, len(table))
	}
	if err := writeAtomic(filepath.Join(nd, "gid."+strconv.Itoa(idx)), gid.hex()+"\n"); err != nil {
		return 0, err
	}
	if err := writeAtomic(filepath.Join(string(d), "gid", gid.hex()), node+"\n"); err != nil {
		return 0, err
	}
	return idx, nil
}

// Unregister removes gid from node's table and its route, if the route still
// names node. Unregistering a GID that is not registered is not an error.
func (d Dir) Unregister(node string, gid GID) error {
	nd, err := d.nodeDir(node)
	if err != nil {
		return err
	}
	table, err := d.Table(node)
	if err != nil {
		return err
	}
	for i, g := range table {
		if g == gid {
			if err := os.Remove(filepath.Join(nd, "gid."+strconv.Itoa(i))); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("fabric: %w", err)
			}
		}
	}
	route := filepath.Join(string(d), "gid", gid.hex())
	if owner, err := os.ReadFile(route); err == nil && strings.TrimSpace(string(owner)) == node {
		if err := os.Remove(route); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("fabric: %w", err)
		}
	}
	return nil
}

// Table returns the GIDs registered for node by index (indices ≥ FirstIndex).
func (d Dir) Table(node string) (map[int]GID, error) {
	nd, err := d.nodeDir(node)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(nd)
	if errors.Is(err, os.ErrNotExist) {
		return map[int]GID{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fabric: %w", err)
	}
	table := make(map[int]GID)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "gid.")
		if !ok {
			continue
		}
		i, err := strconv.Atoi(rest)
		if err != nil || i < FirstIndex {
			continue
		}
		b, err := os.ReadFile(filepath.Join(nd, e.Name()))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) { // removed meanwhile
				continue
			}
			return nil, fmt.Errorf("fabric: %w", err)
		}
		g, err := ParseHex(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("fabric: %s: %w", filepath.Join(nd, e.Name()), err)
		}
		table[i] = g
	}
	return table, nil
}

// Owner returns the node a GID routes to.
func (d Dir) Owner(gid GID) (string, error) {
	b, err := os.ReadFile(filepath.Join(string(d), "gid", gid.hex()))
	if err != nil {
		return "", fmt.Errorf("fabric: GID %s: %w", gid, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// RemoveNode deletes everything a node registered (its table and the routes
// that still name it). The backend's own socket file, if any, goes too.
func (d Dir) RemoveNode(node string) error {
	table, err := d.Table(node)
	if err != nil {
		return err
	}
	for _, g := range table {
		if err := d.Unregister(node, g); err != nil {
			return err
		}
	}
	nd, _ := d.nodeDir(node)
	if err := os.RemoveAll(nd); err != nil {
		return fmt.Errorf("fabric: %w", err)
	}
	return nil
}

// ParseHex parses 32 hex digits as a GID.
func ParseHex(s string) (GID, error) {
	var g GID
	if len(s) != 32 {
		return g, fmt.Errorf("GID %q: want 32 hex digits", s)
	}
	if _, err := hex.Decode(g[:], []byte(s)); err != nil {
		return g, fmt.Errorf("GID %q: %w", s, err)
	}
	return g, nil
}

func writeAtomic(path, content string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("fabric: %w", err)
	}
	_, werr := tmp.WriteString(content)
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp.Name(), 0o644)
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("fabric: %w", werr)
	}
	return nil
}
