package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vfrdma/vfrdma/qemu/proto"
)

// netUp brings loopback and VM vm's interfaces on the named networks up,
// each found by its MAC (the driver may take a moment to register it).
func netUp(nets []string, vm int, wait time.Duration) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("net: socket: %w", err)
	}
	defer unix.Close(fd)
	if err := ifUp(fd, "lo"); err != nil {
		return err
	}
	for _, n := range nets {
		name, err := ifByMAC(proto.NetMAC(n, vm), wait)
		if err != nil {
			return err
		}
		p, err := netip.ParsePrefix(proto.NetAddr(n, vm))
		if err != nil {
			return fmt.Errorf("net: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return fmt.Errorf("net: %s: %w", name, err)
		}
		if err := ifr.SetInet4Addr(p.Addr().AsSlice()); err != nil {
			return fmt.Errorf("net: %s: %w", name, err)
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFADDR, ifr); err != nil {
			return fmt.Errorf("net: %s: set address %v: %w", name, p.Addr(), err)
		}
		mask := net.CIDRMask(p.Bits(), 32)
		if err := ifr.SetInet4Addr(mask); err != nil {
			return fmt.Errorf("net: %s: %w", name, err)
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCSIFNETMASK, ifr); err != nil {
			return fmt.Errorf("net: %s: set netmask /%d: %w", name, p.Bits(), err)
		}
		if err := ifUp(fd, name); err != nil {
			return err
		}
	}
	return nil
}

func ifUp(fd int, name string) error {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("net: %s: %w", name, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("net: %s: get flags: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("net: %s: up: %w", name, err)
	}
	return nil
}

// ifByMAC returns the name of the interface with mac, waiting for it.
func ifByMAC(mac string, wait time.Duration) (string, error) {
	want, err := net.ParseMAC(mac)
	if err != nil {
		return "", fmt.Errorf("net: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		paths, _ := filepath.Glob("/sys/class/net/*/address")
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err == nil && strings.TrimSpace(string(b)) == want.String() {
				return filepath.Base(filepath.Dir(p)), nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("net: no interface with MAC %v after %v", want, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
