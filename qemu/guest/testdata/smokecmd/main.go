// Command smokecmd is the plain program of TestBootQEMU: it prints its
// arguments and exits with status 0.
package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	fmt.Println("smokecmd:", strings.Join(os.Args[1:], " "))
}
