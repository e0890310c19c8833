//go:build guest

// Package fake is a test binary for the init's own tests: FAKE_MODE picks
// how it behaves.
package fake

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if os.Getenv("FAKE_MODE") == "" {
		fmt.Println("FAKE_MODE not set")
		os.Exit(3)
	}
	os.Exit(m.Run())
}

func TestOK(t *testing.T) {
	t.Log("env", os.Getenv("FAKE_EXTRA"))
	fmt.Println(strings.Repeat("é", 3000)) // 6000 bytes: split into two lines
	fmt.Fprintln(os.Stderr, "to stderr")
	t.Run("sub", func(t *testing.T) {})
	t.Run("skipped", func(t *testing.T) { t.Skip("not here") })
}

func TestMode(t *testing.T) {
	switch os.Getenv("FAKE_MODE") {
	case "fail":
		t.Error("failed on purpose")
	case "panic":
		go func() { panic("boom in goroutine") }()
		time.Sleep(10 * time.Second)
	case "hang":
		time.Sleep(time.Hour)
	}
}

func TestLast(t *testing.T) {}
