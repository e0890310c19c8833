// Package scripts holds no Go code: its tests run the shell scripts beside
// it (make setup's Go check), so that the host tests, `go test ./...`,
// cover them.
package scripts
