package guest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// InitPackage is the import path of the guest init.
const InitPackage = "github.com/vfrdma/vfrdma/qemu/guestinit"

// GuestTag is the build tag of code meant to run inside the guest: the
// in-guest tests, and the parts of a program that only the bench's guest
// has (pvctl's --vm rendezvous over the control channel). Everything built
// for the guest is built with it.
const GuestTag = "guest"

// BuildInit builds the guest init as a static linux/amd64 binary at out.
// repoRoot is the module root.
func BuildInit(ctx context.Context, repoRoot, out string) error {
	return goTool(ctx, repoRoot, out, "build", "-o", absPath(out), InitPackage)
}

// BuildProgram builds a static linux/amd64 program for the guest at out,
// with the GuestTag build tag. pkg is an import path
// (github.com/vfrdma/vfrdma/cmd/pvctl) or a directory relative to the
// current directory (./cmd/pvctl); the current directory must be inside the
// module.
func BuildProgram(ctx context.Context, pkg, out string) error {
	return goTool(ctx, "", out, "build", "-tags", GuestTag, "-o", absPath(out), pkg)
}

// BuildTestBinary compiles the tests of the package in directory pkgDir,
// with the GuestTag build tag, into a static linux/amd64 binary at out
// (`go test -c`). A package without test files builds no binary: that is
// an error here.
func BuildTestBinary(ctx context.Context, pkgDir, out string) error {
	abs := absPath(out)
	os.Remove(abs) // `go test -c` writes nothing for a package without tests
	if err := goTool(ctx, pkgDir, out, "test", "-c", "-tags", GuestTag, "-o", abs, "."); err != nil {
		return err
	}
	if _, err := os.Stat(abs); err != nil {
		return fmt.Errorf("go test -c in %s: no test binary (no test files for the %s tag?): %w", pkgDir, GuestTag, err)
	}
	return nil
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// goTool runs `go <verb> -trimpath -ldflags=-s -w <args>` in dir with cgo off
// for linux/amd64. Its error carries the tool's output. -s -w drop the
// symbol table and DWARF, not the tables Go tracebacks use.
func goTool(ctx context.Context, dir, out, verb string, args ...string) error {
	if err := os.MkdirAll(filepath.Dir(absPath(out)), 0o755); err != nil {
		return err
	}
	full := append([]string{verb, "-trimpath", "-ldflags=-s -w"}, args...)
	cmd := exec.CommandContext(ctx, "go", full...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	if err := cmd.Run(); err != nil {
		where := dir
		if where == "" {
			where = "."
		}
		return fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(full, " "), where, err, strings.TrimSpace(buf.String()))
	}
	return nil
}
