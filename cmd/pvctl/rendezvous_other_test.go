//go:build !guest

package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A pvctl not built for the bench's guests refuses --vm and says where it
// works.
func TestVMNeedsTheBench(t *testing.T) {
	p := peerFlags{vm: true, tag: "t"}
	_, err := p.open(context.Background())
	assert.ErrorContains(t, err, "pvvm -vms 2")
}
