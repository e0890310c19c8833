package guest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// Program kinds.
const (
	// KindGoTest is a `go test -c` binary. The init runs it with -test.v
	// (and a -test.timeout a little shorter than the program's timeout)
	// and reports each `--- PASS/FAIL/SKIP` line as a test record.
	KindGoTest = "gotest"
	// KindCmd is a plain program: its exit status is its result.
	KindCmd = "cmd"
)

// DefaultTimeout bounds a program whose Timeout is zero.
const DefaultTimeout = 60 * time.Second

// Manifest is what the init runs, in the order given. The initramfs carries
// it as JSON at proto.ManifestPath.
type Manifest struct {
	Modules    []string `json:"modules,omitempty"` // paths in the image, in load order
	BindPVRDMA bool     `json:"bind_pvrdma"`       // bind the pvrdma function's IOMMU group to vfio-pci
	// Net names the bench networks (proto.NetMgmt, proto.NetEth) whose
	// kernel interfaces the init brings up, after the modules and before
	// the programs, with the MAC and address of its VM (proto.NetMAC,
	// proto.NetAddr); and loopback.
	Net   []string `json:"net,omitempty"`
	Steps []Step   `json:"steps"`
}

// Step is one program of a Manifest.
type Step struct {
	Name    string        `json:"name"`           // reported as Record.Prog
	Path    string        `json:"path"`           // path in the image
	Args    []string      `json:"args,omitempty"` // arguments after the program name
	Env     []string      `json:"env,omitempty"`  // KEY=value, added to the init's environment
	Kind    string        `json:"kind"`           // KindGoTest or KindCmd
	Timeout time.Duration `json:"timeout_ns"`     // after this the init kills the program
	Only    []int         `json:"only,omitempty"` // the VMs (by index) that run it; none: every VM
	// Retry reruns a step that fails, until this long after its start (a
	// client whose server, in another VM, may not be up yet).
	Retry time.Duration `json:"retry_ns,omitempty"`
	// OKIfOutput, if set, makes a failed exit count as success when the
	// program printed a line containing it after its exchange with its
	// peer ("remote address"): perftest's client exits 1 with "Can't
	// produce a report" when its CPU-clock sampling (a linear fit, r^2 <
	// 0.9) fails on a loaded TCG host, after the traffic has completed.
	OKIfOutput string `json:"ok_if_output,omitempty"`
}

// Validate reports the first thing wrong with m.
func (m *Manifest) Validate() error {
	seen := make(map[string]bool, len(m.Steps))
	for i, s := range m.Steps {
		if err := validName(s.Name); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		if seen[s.Name] {
			return fmt.Errorf("step %d: name %q used twice", i, s.Name)
		}
		seen[s.Name] = true
		if !strings.HasPrefix(s.Path, "/") {
			return fmt.Errorf("step %s: path %q is not absolute", s.Name, s.Path)
		}
		if s.Kind != KindGoTest && s.Kind != KindCmd {
			return fmt.Errorf("step %s: kind %q is neither %q nor %q", s.Name, s.Kind, KindGoTest, KindCmd)
		}
		if s.Timeout <= 0 {
			return fmt.Errorf("step %s: timeout %v is not positive", s.Name, s.Timeout)
		}
		for _, e := range s.Env {
			if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
				return fmt.Errorf("step %s: env entry %q is not KEY=value", s.Name, e)
			}
		}
	}
	for _, p := range m.Modules {
		if !strings.HasPrefix(p, "/") {
			return fmt.Errorf("module path %q is not absolute", p)
		}
	}
	for _, n := range m.Net {
		if n != proto.NetMgmt && n != proto.NetEth {
			return fmt.Errorf("net: unknown network %q", n)
		}
	}
	return nil
}

// validName accepts names usable as a file name under /bin.
func validName(name string) error {
	switch {
	case name == "":
		return errors.New("empty name")
	case name == "." || name == "..":
		return fmt.Errorf("name %q is not a file name", name)
	case strings.ContainsAny(name, "/\x00 \t\n"):
		return fmt.Errorf("name %q contains a slash, a NUL or white space", name)
	}
	return nil
}

// Marshal returns m as indented JSON after validating it.
func (m *Manifest) Marshal() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("guest: manifest: %w", err)
	}
	b, err := json.MarshalIndent(m, "", "\t")
	if err != nil {
		return nil, fmt.Errorf("guest: manifest: %w", err)
	}
	return append(b, '\n'), nil
}

// UnmarshalManifest decodes and validates a manifest. Unknown fields are an
// error: the init and the image builder are built from the same tree.
func UnmarshalManifest(data []byte) (*Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("guest: manifest: %w", err)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("guest: manifest: %w", err)
	}
	return &m, nil
}
