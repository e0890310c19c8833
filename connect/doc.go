// Package connect sets up connections between queue pairs of two
// processes: it exchanges what each end's QPs need of the other's (QP
// number, GID, first PSN, path MTU, Q_Key; a list of them for several
// QPs) and the memory regions each end lets the other's one-sided
// operations name (address, rkey, length) over TCP, and then holds both
// ends at a barrier until each has posted its receives.
//
// # Use
//
// One end listens, the other dials; then both run the same steps:
//
//	ln, err := connect.Listen(ctx, ":7471", nil)   // the server
//	c, err := ln.Accept(ctx)
//
//	c, err := connect.Dial(ctx, "host:7471", nil)  // the client: retries until the server is up
//
//	mine := connect.Endpoint{QPN: qp.QPN(), GID: dev.GID(), PSN: connect.RandomPSN()}
//	peer, err := c.Exchange(ctx, connect.Info{Endpoints: []connect.Endpoint{mine},
//		Regions: []connect.Region{connect.RegionOf(mr)}}) // an MR the peer may WRITE into
//	err = qp.Connect(ctx, peer.Endpoints[0].Remote(), mine.PSN)
//	qp.PostRecv(recvs, 0)                          // receives first,
//	err = c.Ready(ctx)                             // then the barrier:
//	qp.PostSend(sends, 0)                          // the peer's receives are posted
//
// Ready is what makes the first send safe. A peer that sends before the
// other end posted its receives gets RNR NAKs on RC (and retries, or fails
// with RNR_RETRY_EXC_ERR) and loses the datagram on UD, silently. Ready
// returns once both ends called it, so a caller that posts its receives
// before Ready and sends only after it never meets either. Barrier holds
// the two ends at further named points (native format).
//
// # Formats
//
// Native (the default) is this package's own: a versioned binary message
// each way carrying any number of endpoints with their path MTU and Q_Key,
// regions (Info.Regions: RegionOf an MR), and optional application bytes
// (Info.Data); named barriers; and a refusal that tells the peer what was
// wrong with what it sent. Version 2 added the regions; an end of version
// 1 is refused by its version. Info.MarshalBinary and UnmarshalBinary are
// the same message for a channel other than a Conn (a key/value store two
// ends share), with the same checks.
//
// RDMACore and RDMACoreSRQ speak the exchange of rdma-core's example
// programs, so that a vfrdma end runs against ibv_rc_pingpong,
// ibv_ud_pingpong (RDMACore) or ibv_srq_pingpong (RDMACoreSRQ) on another
// machine. Each QP's address is one 52-byte text message: LID, QPN and PSN
// in hex (4, 6 and 6 digits), the GID's 16 bytes in order as 32 hex
// digits, colon-separated, NUL-terminated. The client writes its
// message(s) first; the server reads them, connects its QPs, writes its
// own; the client answers "done" (NUL-terminated). ibv_srq_pingpong
// writes 256 messages each way, whatever its QP count: its QPs' first,
// zeros after. The server here writes its messages at Ready, not at
// Exchange, for an rdma-core client sends as soon as it has read them.
// These formats carry no MTU, Q_Key, region or data; the Q_Key of the endpoints
// they return is RDMACoreQKey, the one ibv_ud_pingpong uses. Their port is
// RDMACorePort, which Listen and Dial add to an address given without one.
//
// # Strangers and stalls
//
// Whoever connects to a listener, or answers a dial, may speak another
// protocol: perftest's ib_send_lat and kin (their own exchange, which
// begins with their version, on rdma-core's port), a port scanner, a web
// client. What the peer sends is checked as it arrives, a read at a time,
// so such a peer is refused at its first bytes that cannot be the
// exchange (ErrProtocol), not once it sent a whole message's worth, which
// it may never do. The error quotes what arrived (escaped, at most 64
// bytes) and names the protocol it looks like.
//
// Once connected, each message has Options.ExchangeTimeout (default
// DefaultExchangeTimeout): the peer takes each of this end's within it,
// sends each of its own whole within it of the message's first byte, and
// the client's first message begins within it of the server's first
// Exchange (a client writes first, as soon as it is connected: make the
// QPs before Dial). A peer that breaks off gets an error wrapping
// ErrTimeout. The wait between the peer's messages, the peer at work
// (connecting its QPs, posting receives, running until the next barrier),
// is bounded by the step's context alone.
//
// # Errors
//
// Every error of a Conn, Listener, Dial or DialTCP is an *Error naming the
// step and the peer's address. What the peer sent is input: a message
// that is not the exchange (another protocol, wrong magic or version, a
// count or length out of bounds, a truncated message, a bad GID, number
// or region) is an error wrapping ErrProtocol, never a panic, and no length
// read from the network allocates more than what arrived (plus a bounded
// chunk); a peer that stalls inside the exchange, ErrTimeout. A misused
// call (Ready before Exchange or a second time, an endpoint that is not
// 24-bit, a count or length past its bound) wraps vfrdma.ErrInvalid and
// leaves the Conn whole. After an error of the exchange itself the Conn
// is broken: later calls return the same error.
//
// # Concurrency and lifecycle
//
// A Conn is single-owner: one goroutine runs its steps, in order (a step
// called while another runs returns vfrdma.ErrBusy); Close may be called
// from any goroutine and ends a step under way. A Listener's Accept takes
// one caller at a time (a second at once gets vfrdma.ErrBusy); Close is
// safe at any time. After Close, every step of a Conn and Accept of a
// Listener return vfrdma.ErrClosed. Close both when done: the QPs outlive
// the connection, which is only for setup. Every wait takes a context; a
// context's deadline bounds the reads and writes under way, and its
// cancellation ends them.
//
// The package never prints or logs; Options.Progress reports dial retries
// to a caller that wants to.
package connect
