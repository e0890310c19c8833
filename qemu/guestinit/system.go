package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// mountAll mounts the pseudo file systems the init and the programs need.
// It runs before the console is open, so it returns its errors.
func mountAll() []error {
	var errs []error
	for _, m := range []struct {
		src, target, fstype string
		flags               uintptr
		data                string
	}{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		// Pseudo-terminals, for programs and tests that open /dev/ptmx.
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "mode=0620,ptmxmode=0666"},
		// POSIX shared memory (shm_open), which UCX's memory domains
		// look for even when no shared-memory transport is used.
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	} {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			errs = append(errs, fmt.Errorf("mount %s: %w", m.target, err))
			continue
		}
		err := unix.Mount(m.src, m.target, m.fstype, m.flags, m.data)
		if err != nil && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err))
		}
	}
	// devtmpfs has no ptmx node in this kernel; the devpts instance has one.
	if _, err := os.Lstat("/dev/ptmx"); errors.Is(err, os.ErrNotExist) {
		if err := os.Symlink("pts/ptmx", "/dev/ptmx"); err != nil {
			errs = append(errs, fmt.Errorf("link /dev/ptmx: %w", err))
		}
	}
	return errs
}

// loadModules loads kernel modules with finit_module, in order. A module
// already loaded is fine.
func loadModules(paths []string) error {
	for _, p := range paths {
		if err := loadModule(p); err != nil {
			return err
		}
	}
	return nil
}

func loadModule(path string) error {
	name := filepath.Base(path)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("load module %s: %w", name, err)
	}
	defer unix.Close(fd)
	flags := 0
	if !strings.HasSuffix(path, ".ko") {
		flags = unix.MODULE_INIT_COMPRESSED_FILE
	}
	err = unix.FinitModule(fd, "", flags)
	var errno unix.Errno
	switch {
	case err == nil, errors.Is(err, unix.EEXIST):
		return nil
	case errors.As(err, &errno):
		return fmt.Errorf("load module %s: finit_module: %s (errno %d: %v)", name, unix.ErrnoName(errno), int(errno), err)
	default:
		return fmt.Errorf("load module %s: finit_module: %w", name, err)
	}
}

// powerOff ends the VM: it kills what the programs left behind, syncs,
// lets the console drain and powers off. If that fails the init exits,
// which panics the kernel; with panic=-1 and -no-reboot QEMU then exits.
func powerOff(rep *reporter) {
	unix.Kill(-1, unix.SIGKILL) // every process but init
	unix.Sync()
	drain(rep.w, 2*time.Second)
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	rep.logf("power off: %v", err)
	drain(rep.w, time.Second)
	os.Exit(1)
}
