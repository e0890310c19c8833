// Package scripts holds no Go code: its tests run the shell scripts beside
// it (make setup's Go check; make bench's arguments, results folders and
// charts, with stand-ins for its VM runs) and check rules every script
// keeps, so that the host tests, `go test ./...`, cover them.
package scripts
