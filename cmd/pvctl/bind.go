package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vfrdma/vfrdma/pci"
)

const vfioDriver = "vfio-pci"

// bindState is what bind leaves for unbind: each member's earlier driver.
type bindState map[string]string

func (e *env) statePath(f pci.Function) string {
	return filepath.Join(e.runDir, "bind-"+strings.ReplaceAll(f.Addr.String(), ":", "_")+".json")
}

func cmdBind(e *env, args []string) error {
	if e.model != "" {
		return errModel
	}
	f, err := e.target(args)
	if err != nil {
		return err
	}
	prev, err := e.bus.BindGroup(f.Addr, vfioDriver)
	if err != nil {
		return err
	}
	st := bindState{}
	for a, d := range prev {
		st[a.String()] = d
	}
	// Keep the drivers of the first bind: a second bind finds vfio-pci
	// everywhere and must not overwrite them.
	if _, err := os.Stat(e.statePath(f)); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(e.runDir, 0o755); err != nil {
			return err
		}
		b, _ := json.MarshalIndent(st, "", "  ")
		if err := os.WriteFile(e.statePath(f), b, 0o644); err != nil {
			return err
		}
	}
	_, members, err := e.bus.GroupMembers(f.Addr)
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(map[string]any{"bound": true, "group": f.IOMMUGroup, "previous": st})
	}
	fmt.Fprintf(e.out, "IOMMU group %d bound to %s:\n", f.IOMMUGroup, vfioDriver)
	for _, m := range members {
		was := st[m.Addr.String()]
		if was == "" {
			was = "no driver"
		}
		fmt.Fprintf(e.out, "  %s (was %s)\n", m, was)
	}
	return nil
}

func cmdUnbind(e *env, args []string) error {
	if e.model != "" {
		return errModel
	}
	f, err := e.target(args)
	if err != nil {
		return err
	}
	prev := map[pci.Addr]string{}
	b, err := os.ReadFile(e.statePath(f))
	switch {
	case err == nil:
		var st bindState
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("%s: %w", e.statePath(f), err)
		}
		for s, d := range st {
			a, err := pci.ParseAddr(s)
			if err != nil {
				return fmt.Errorf("%s: %w", e.statePath(f), err)
			}
			prev[a] = d
		}
	case errors.Is(err, os.ErrNotExist):
		// Not bound by pvctl: release the group's vfio-pci members unbound.
		_, members, err := e.bus.GroupMembers(f.Addr)
		if err != nil {
			return err
		}
		for _, m := range members {
			if m.Driver == vfioDriver {
				prev[m.Addr] = ""
			}
		}
	default:
		return err
	}
	if err := e.bus.RestoreGroup(prev); err != nil {
		return err
	}
	os.Remove(e.statePath(f))
	if e.json {
		return e.printJSON(map[string]any{"bound": false, "group": f.IOMMUGroup})
	}
	fmt.Fprintf(e.out, "IOMMU group %d released from %s\n", f.IOMMUGroup, vfioDriver)
	return nil
}
