package connect_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/pvsim"
)

// Two processes connect an RC QP each and pass a message each way. Here
// both run in this process, each on a device model (package pvsim) on one
// fabric, the server on a goroutine; on machines with the NIC each opens
// its device (vfrdma.Open) and the client dials the server's host.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fabric := pvsim.NewFabric()

	ln, err := connect.Listen(ctx, "127.0.0.1:0", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	heard := make(chan string)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close()
		heard <- side(ctx, fabric, c, "hello from the server")
	}()

	// Dial retries until the server listens.
	c, err := connect.Dial(ctx, ln.Addr().String(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println("the client heard:", side(ctx, fabric, c, "hello from the client"))
	fmt.Println("the server heard:", <-heard)
	// Output:
	// the client heard: hello from the server
	// the server heard: hello from the client
}

// side is one process's side: open the device, make a QP, exchange
// addresses, connect, post a receive, Ready, send, and wait for both
// completions.
func side(ctx context.Context, fabric *pvsim.Fabric, c *connect.Conn, msg string) string {
	m, err := pvsim.New(pvsim.Config{Fabric: fabric})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	d, err := vfrdma.OpenFunction(m, nil) // with the NIC: vfrdma.Open(bdf, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	pd, _ := d.AllocPD(ctx)
	cq, _ := d.CreateCQ(ctx, 16)
	qp, _ := pd.CreateQP(ctx, &vfrdma.QPConfig{Type: vfrdma.RC, SendCQ: cq, RecvCQ: cq, SignalAll: true})
	mr, _ := pd.AllocMR(ctx, 8192, vfrdma.AccessLocalWrite)

	mine := connect.Endpoint{QPN: qp.QPN(), GID: d.GID(), PSN: connect.RandomPSN()}
	peer, err := c.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{mine}})
	if err != nil {
		log.Fatal(err)
	}
	if err := qp.Connect(ctx, peer.Endpoints[0].Remote(), mine.PSN); err != nil {
		log.Fatal(err)
	}
	// The receive first, then Ready: once Ready returns, the peer's
	// receive is posted too, and sending is safe.
	qp.PostRecv([]vfrdma.RecvWR{{WRID: 1, SGEs: []vfrdma.SGE{mr.SGE(4096, 4096)}}}, 0)
	if err := c.Ready(ctx); err != nil {
		log.Fatal(err)
	}
	copy(mr.Bytes(), msg)
	qp.PostSend([]vfrdma.SendWR{{WRID: 2, SGEs: []vfrdma.SGE{mr.SGE(0, len(msg))}}}, 0)

	var got string
	wcs := make([]vfrdma.WC, 4)
	for done := 0; done < 2; {
		if err := cq.Wait(ctx); err != nil {
			log.Fatal(err)
		}
		n, _ := cq.Poll(wcs)
		for _, wc := range wcs[:n] {
			if wc.Opcode == vfrdma.WCRecv {
				got = string(mr.Bytes()[4096 : 4096+wc.ByteLen])
			}
		}
		done += n
	}
	return got
}
