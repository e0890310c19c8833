//go:build !guest

package vfio

// envPath is what PathAuto resolves to before the kernel is asked: ""
// (auto) outside the bench's guest builds (path_guest.go).
const envPath = ""

// envPathVar names the variable path_guest.go reads, for errors.
const envPathVar = "VFRDMA_VFIO"
