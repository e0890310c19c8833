package main

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
)

// The message is rdma-core's: 52 bytes with the NUL, LID, QPN and PSN in
// hex, the GID's bytes in order as 32 hex digits; it decodes back.
func TestRdmaCoreMessageFormat(t *testing.T) {
	gid := vfrdma.GID{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 10, 0, 2}
	b := encodeRdmaCore(peerInfo{QPN: 0x11, GID: gid}, 0xdac0b0)
	assert.Equal(t, "0000:000011:dac0b0:00000000000000000000ffff0a0a0002\x00", string(b))
	assert.Len(t, b, rdmaCoreMsgLen)
	p, err := decodeRdmaCore(b)
	require.NoError(t, err)
	assert.Equal(t, peerInfo{QPN: 0x11, PSN: 0xdac0b0, GID: gid, QKey: rdmaCoreQKey}, p)
	for _, bad := range []string{"", "0000:11:22", "0000:zz:000000:00000000000000000000ffff0a0a0002", "0000:000011:000000:0000"} {
		_, err := decodeRdmaCore([]byte(bad))
		assert.Error(t, err, "%q", bad)
	}
}

// The order of the exchange: the client writes, the server reads and
// writes its own only at the barrier (after its QP is connected), the
// client then writes "done", which the server's barrier waits for.
func TestRdmaCoreExchangeOrder(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv := &rdmaCoreExchange{conn: a, srv: true}
	cli := &rdmaCoreExchange{conn: b, psn: 7}
	done := make(chan error, 1)
	var fromCli peerInfo
	go func() {
		var err error
		if fromCli, err = srv.swap(ctx, peerInfo{QPN: 2}); err == nil {
			err = srv.barrier(ctx, "ready")
		}
		done <- err
	}()
	fromSrv, err := cli.swap(ctx, peerInfo{QPN: 1})
	require.NoError(t, err)
	require.NoError(t, cli.barrier(ctx, "ready"))
	require.NoError(t, <-done)
	assert.Equal(t, uint32(2), fromSrv.QPN)
	assert.Equal(t, uint32(1), fromCli.QPN)
	assert.Equal(t, uint32(7), fromCli.PSN)
	assert.True(t, srv.server())
	assert.False(t, cli.server())
}
