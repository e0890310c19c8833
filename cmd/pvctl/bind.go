package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vfrdma/vfrdma/pci"
)

const vfioDriver = "vfio-pci"

// bindState is what bind leaves for unbind: each member's earlier driver.
type bindState map[string]string

func (e *env) statePath(f pci.Function) string {
	return filepath.Join(e.runDir, "bind-"+strings.ReplaceAll(f.Addr.String(), ":", "_")+".json")
}

// bindAbout is bind's help beyond its summary.
const bindAbout = `Every member of the function's IOMMU group goes to vfio-pci, the slot's
vmxnet3 function with it; what each had is kept for unbind. A network
interface the kernel has on a member (the vmxnet3 NIC) goes away with its
driver: bind refuses while one is up (its flags have IFF_UP, or its
operstate is up) or has an IPv4 or IPv6 address, unless --force.
--dry-run prints what bind would unbind and bind, and whether it would
refuse (then exiting 1, as bind would), and changes nothing.`

// bindOpts are bind's flags.
type bindOpts struct {
	force, dryRun bool
}

// bindFlags declares bind's flags on fs.
func bindFlags(fs *flag.FlagSet) *bindOpts {
	o := &bindOpts{}
	fs.BoolVar(&o.force, "force", false, "take network interfaces from the kernel even while they are up or have an address (they go away with their driver)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "print what bind would unbind and bind, and whether it would refuse; change nothing")
	return o
}

// netdev is a network interface the kernel has on a PCI function.
type netdev struct {
	Name      string   `json:"name"`
	Operstate string   `json:"operstate"` // class/net/NAME/operstate: up, down, unknown, ...
	Up        bool     `json:"up"`        // IFF_UP in class/net/NAME/flags (ip link set NAME up)
	Addrs     []string `json:"addresses"`
}

// inUse reports a network interface bind must not take unasked: up, or
// with an address.
func (n *netdev) inUse() bool { return n.Up || n.Operstate == "up" || len(n.Addrs) > 0 }

func (n *netdev) String() string {
	s := fmt.Sprintf("%s (operstate %s", n.Name, n.Operstate)
	if n.Up {
		s += ", up"
	}
	if len(n.Addrs) > 0 {
		s += ", addresses " + strings.Join(n.Addrs, " ")
	}
	return s + ")"
}

// iffUp is IFF_UP, the administrative up bit of a netdev's flags.
const iffUp = 0x1

// netdevs returns the network interfaces the kernel has on f: the names in
// its sysfs net directory, each one's operstate and flags from
// class/net/NAME, and its addresses from e.ifAddrs (none when nil).
func (e *env) netdevs(f pci.Function) ([]netdev, error) {
	ents, err := os.ReadDir(filepath.Join(e.sysfs, "bus", "pci", "devices", f.Addr.String(), "net"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []netdev
	for _, ent := range ents {
		n := netdev{Name: ent.Name(), Addrs: []string{}}
		dir := filepath.Join(e.sysfs, "class", "net", n.Name)
		b, err := os.ReadFile(filepath.Join(dir, "operstate"))
		if err != nil {
			return nil, fmt.Errorf("%s: network interface %s: %w", f.Addr, n.Name, err)
		}
		n.Operstate = strings.TrimSpace(string(b))
		if b, err = os.ReadFile(filepath.Join(dir, "flags")); err != nil {
			return nil, fmt.Errorf("%s: network interface %s: %w", f.Addr, n.Name, err)
		}
		flags, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(b)), "0x"), 16, 32)
		if err != nil {
			return nil, fmt.Errorf("%s: network interface %s: flags %q: %w", f.Addr, n.Name, b, err)
		}
		n.Up = flags&iffUp != 0
		if e.ifAddrs != nil {
			if n.Addrs, err = e.ifAddrs(n.Name); err != nil {
				return nil, fmt.Errorf("%s: network interface %s: %w", f.Addr, n.Name, err)
			}
		}
		out = append(out, n)
	}
	return out, nil
}

// kernelIfAddrs returns a network interface's addresses as the kernel has
// them (with their prefix length).
func kernelIfAddrs(name string) ([]string, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, err
	}
	as, err := ifi.Addrs()
	if err != nil {
		return nil, err
	}
	out := []string{}
	for _, a := range as {
		out = append(out, a.String())
	}
	return out, nil
}

// bindMember is what bind does to one member of the group.
type bindMember struct {
	BDF     string   `json:"bdf"`
	ID      string   `json:"vendor_device"`
	Driver  string   `json:"driver"` // now; "" for none
	Action  string   `json:"action"` // "bind" (to vfio-pci) or "none" (there already)
	Netdevs []netdev `json:"netdevs"`
}

// bindPlan is what bind would do to f's group.
type bindPlan struct {
	Group   int          `json:"iommu_group"`
	Members []bindMember `json:"members"`
	// Refused is why bind would refuse ("" when it would not).
	Refused string `json:"refused"`
}

// planBind works out what binding f's group would do, and whether a
// network interface in use makes bind refuse (unless force).
func (e *env) planBind(f pci.Function, force bool) (bindPlan, error) {
	group, members, err := e.bus.GroupMembers(f.Addr)
	if err != nil {
		return bindPlan{}, err
	}
	p := bindPlan{Group: group, Members: []bindMember{}}
	var busy []string
	for _, m := range members {
		if m.IsBridge() {
			continue // BindGroup leaves bridges alone
		}
		bm := bindMember{BDF: m.Addr.String(), ID: fmt.Sprintf("%04x:%04x", m.Vendor, m.Device), Driver: m.Driver, Action: "none", Netdevs: []netdev{}}
		if m.Driver != vfioDriver {
			bm.Action = "bind"
			nds, err := e.netdevs(m)
			if err != nil {
				return bindPlan{}, err
			}
			bm.Netdevs = append(bm.Netdevs, nds...)
			for i := range nds {
				if nds[i].inUse() {
					busy = append(busy, fmt.Sprintf("%s's %v", m.Addr, &nds[i]))
				}
			}
		}
		p.Members = append(p.Members, bm)
	}
	if len(busy) > 0 && !force {
		p.Refused = fmt.Sprintf("the kernel's network interface %s is in use: binding IOMMU group %d to %s takes it away "+
			"(bring it down and remove its addresses first, or give --force)", strings.Join(busy, " and "), group, vfioDriver)
	}
	return p, nil
}

func printPlan(e *env, p *bindPlan) {
	fmt.Fprintf(e.out, "bind --dry-run: IOMMU group %d to %s; nothing changed:\n", p.Group, vfioDriver)
	for _, m := range p.Members {
		was := m.Driver
		if was == "" {
			was = "no driver"
		}
		switch {
		case m.Action == "none":
			fmt.Fprintf(e.out, "  %s %s: on %s already, left alone\n", m.BDF, m.ID, vfioDriver)
		case m.Driver == "":
			fmt.Fprintf(e.out, "  %s %s: would bind to %s (it has no driver)\n", m.BDF, m.ID, vfioDriver)
		default:
			fmt.Fprintf(e.out, "  %s %s: would unbind from %s and bind to %s\n", m.BDF, m.ID, was, vfioDriver)
		}
		for i := range m.Netdevs {
			n := &m.Netdevs[i]
			use := "not in use"
			if n.inUse() {
				use = "IN USE"
			}
			fmt.Fprintf(e.out, "    network interface %v: %s, goes away\n", n, use)
		}
	}
	if p.Refused != "" {
		fmt.Fprintf(e.out, "bind would refuse: %s\n", p.Refused)
	}
}

func cmdBind(e *env, args []string) error {
	fs := newFlagSet(e, "bind")
	o := bindFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if e.model != "" {
		return errModel
	}
	if err := e.checkBDF(fs.Args()); err != nil {
		return err
	}
	f, err := e.target(fs.Args())
	if err != nil {
		return err
	}
	plan, err := e.planBind(f, o.force)
	if err != nil {
		return err
	}
	if o.dryRun {
		if e.json {
			err = e.printJSON(map[string]any{"dry_run": true, "plan": plan})
		} else {
			printPlan(e, &plan)
		}
		if plan.Refused != "" {
			return errors.New("bind would refuse: " + plan.Refused)
		}
		return err
	}
	if plan.Refused != "" {
		return errors.New(plan.Refused)
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
		type previous struct {
			BDF    string `json:"bdf"`
			Driver string `json:"driver"` // "" for none
		}
		doc := struct {
			Bound    bool       `json:"bound"`
			Group    int        `json:"iommu_group"`
			Previous []previous `json:"previous"`
		}{Bound: true, Group: f.IOMMUGroup, Previous: []previous{}}
		for _, m := range members {
			if was, ok := st[m.Addr.String()]; ok {
				doc.Previous = append(doc.Previous, previous{m.Addr.String(), was})
			}
		}
		return e.printJSON(doc)
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
	fs := newFlagSet(e, "unbind")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if e.model != "" {
		return errModel
	}
	args = fs.Args()
	if err := e.checkBDF(args); err != nil {
		return err
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
		return e.printJSON(map[string]any{"bound": false, "iommu_group": f.IOMMUGroup})
	}
	fmt.Fprintf(e.out, "IOMMU group %d released from %s\n", f.IOMMUGroup, vfioDriver)
	return nil
}
