//go:build !cgo

package main

// Without cgo there is no library to build: the package is an empty
// program, so that `go build ./...` with CGO_ENABLED=0 (the guest's static
// builds) still succeeds.
func main() {}
