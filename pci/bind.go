package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// BindGroup binds every member of a's IOMMU group to driver (normally
// "vfio-pci"), so that VFIO can hand the group out.
//
// For each member not already bound to driver it writes driver to the
// member's driver_override, unbinds it from its current driver, writes its
// address to the bus's drivers_probe, and checks that driver took it.
// Bridges are left alone. previous maps every member handled to the driver it
// had before ("" for none), members already bound to driver included; pass it
// to RestoreGroup to undo the binding.
//
// On error the members already moved are put back (as RestoreGroup does) and
// the returned error says what failed: ErrDriverNotLoaded (load the module),
// ErrPermission (run as root), ErrBind (the driver refused the device), or
// ErrNoIOMMUGroup. The error also says if putting things back failed.
func (b *Bus) BindGroup(a Addr, driver string) (previous map[Addr]string, err error) {
	if driver == "" {
		return nil, &OpError{Op: "bind group", Dev: a.String(), Err: errors.New("empty driver name")}
	}
	_, members, err := b.GroupMembers(a)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(b.driverDir(driver)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w: %s is not registered (no %s): run `modprobe %s`",
				ErrDriverNotLoaded, driver, b.driverDir(driver), driver)
		}
		return nil, &OpError{Op: "bind group", Dev: a.String(), Err: err}
	}
	previous = make(map[Addr]string, len(members))
	touched := make(map[Addr]string, len(members))
	for _, m := range members {
		if m.IsBridge() {
			continue
		}
		previous[m.Addr] = m.Driver
		if m.Driver == driver {
			continue
		}
		touched[m.Addr] = m.Driver
		if err := b.bindOne(m, driver); err != nil {
			err = &OpError{Op: "bind group", Dev: m.Addr.String(), Err: err}
			if rerr := b.RestoreGroup(touched); rerr != nil {
				err = fmt.Errorf("%w (undoing the members already moved failed too: %w)", err, rerr)
			}
			return nil, err
		}
	}
	return previous, nil
}

// bindOne moves m to driver: driver_override, unbind, drivers_probe, check.
func (b *Bus) bindOne(m Function, driver string) error {
	dir := b.deviceDir(m.Addr)
	if err := b.write(filepath.Join(dir, "driver_override"), []byte(driver+"\n")); err != nil {
		return classify(err)
	}
	if m.Driver != "" {
		if err := b.write(filepath.Join(b.driverDir(m.Driver), "unbind"), []byte(m.Addr.String())); err != nil {
			return fmt.Errorf("unbind from %s: %w", m.Driver, classify(err))
		}
	}
	if err := b.write(filepath.Join(b.root, "bus", "pci", "drivers_probe"), []byte(m.Addr.String())); err != nil {
		return fmt.Errorf("drivers_probe: %w", classify(err))
	}
	now, err := linkBase(filepath.Join(dir, "driver"))
	if err != nil {
		return err
	}
	if now != driver {
		if now == "" {
			now = "no driver"
		}
		return fmt.Errorf("%w: %s did not take %04x:%04x after drivers_probe (it has %s; see the kernel log)",
			ErrBind, driver, m.Vendor, m.Device, now)
	}
	return nil
}

// RestoreGroup puts functions back on the drivers BindGroup reported: for
// each one it clears driver_override and, unless it is already bound to its
// previous driver, unbinds it and binds it to that driver ("" leaves it
// unbound). It goes on after a failure and returns all of them joined.
func (b *Bus) RestoreGroup(previous map[Addr]string) error {
	addrs := make([]Addr, 0, len(previous))
	for a := range previous {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, Addr.Compare)
	var errs []error
	for _, a := range addrs {
		if err := b.restoreOne(a, previous[a]); err != nil {
			errs = append(errs, &OpError{Op: "restore group", Dev: a.String(), Err: err})
		}
	}
	return errors.Join(errs...)
}

func (b *Bus) restoreOne(a Addr, prev string) error {
	dir := b.deviceDir(a)
	if err := b.write(filepath.Join(dir, "driver_override"), []byte("\n")); err != nil {
		return fmt.Errorf("clear driver_override: %w", classify(err))
	}
	now, err := linkBase(filepath.Join(dir, "driver"))
	if err != nil {
		return err
	}
	if now == prev {
		return nil
	}
	if now != "" {
		if err := b.write(filepath.Join(b.driverDir(now), "unbind"), []byte(a.String())); err != nil {
			return fmt.Errorf("unbind from %s: %w", now, classify(err))
		}
	}
	if prev == "" {
		return nil
	}
	if err := b.write(filepath.Join(b.driverDir(prev), "bind"), []byte(a.String())); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: bind back to %s: run `modprobe %s`", ErrDriverNotLoaded, prev, prev)
		}
		return fmt.Errorf("bind back to %s: %w", prev, classify(err))
	}
	return nil
}
