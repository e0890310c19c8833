package connect_test

import (
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/connect"
	"github.com/vfrdma/vfrdma/pvsim"
)

// regionsAtLimit is n regions, each with its fields at their bounds: the
// last byte at 2^64-1, the rkey all ones, a length of 1 and of 2^63.
func regionsAtLimit(n int) []connect.Region {
	rs := make([]connect.Region, n)
	for i := range rs {
		rs[i] = connect.Region{Addr: 1 << 63, Len: 1 << 63, RKey: 0xffffffff - uint32(i)}
		if i%2 == 1 {
			rs[i] = connect.Region{Addr: 0xffffffffffffffff, Len: 1, RKey: uint32(i)}
		}
	}
	return rs
}

// The two ends swap their regions with their endpoints and data, in
// order, both ways.
func TestExchangeSwapsRegionsBothWays(t *testing.T) {
	ctx := withTimeout(t, 10*time.Second)
	srv, cli := pair(t, ctx, nil)
	srvInfo := connect.Info{
		Endpoints: []connect.Endpoint{{QPN: 0x11, GID: gidA}},
		Regions:   []connect.Region{{Addr: 0x7f0000001000, RKey: 0x1234, Len: 4096}, {Addr: 0x2000, RKey: 5, Len: 8}},
		Data:      []byte("write"),
	}
	cliInfo := connect.Info{Endpoints: []connect.Endpoint{{QPN: 0x22, GID: gidB}}, Regions: []connect.Region{{Addr: 0x3000, RKey: 9, Len: 1}}}
	var fromCli, fromSrv connect.Info
	srvErr, cliErr := both(func() (err error) {
		fromCli, err = srv.Exchange(ctx, srvInfo)
		return err
	}, func() (err error) {
		fromSrv, err = cli.Exchange(ctx, cliInfo)
		return err
	})
	require.NoError(t, srvErr)
	require.NoError(t, cliErr)
	assert.Equal(t, cliInfo, fromCli)
	assert.Equal(t, srvInfo, fromSrv)
}

// MaxRegions regions with their fields at their bounds go across, both
// ways, beside the other bounds.
func TestTheRegionBoundsHoldAtTheBound(t *testing.T) {
	ctx := withTimeout(t, 30*time.Second)
	srv, cli := pair(t, ctx, nil)
	in := connect.Info{Endpoints: atLimit(connect.MaxEndpoints), Regions: regionsAtLimit(connect.MaxRegions), Data: make([]byte, connect.MaxData)}
	var fromCli, fromSrv connect.Info
	srvErr, cliErr := both(func() (err error) {
		fromCli, err = srv.Exchange(ctx, in)
		return err
	}, func() (err error) {
		fromSrv, err = cli.Exchange(ctx, in)
		return err
	})
	require.NoError(t, srvErr)
	require.NoError(t, cliErr)
	assert.Equal(t, in, fromCli)
	assert.Equal(t, in, fromSrv)
}

// One past a region's bound, this end's Info is refused before anything
// is sent (vfrdma.ErrInvalid), and the rdma-core formats carry no region.
func TestOnePastARegionBoundThisEndsInfoIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    connect.Format
		in   connect.Info
		want string
	}{
		{"regions", connect.Native, connect.Info{Regions: regionsAtLimit(connect.MaxRegions + 1)}, "4097 regions: at most 4096"},
		{"empty", connect.Native, connect.Info{Regions: []connect.Region{{Addr: 0x1000, RKey: 3}}}, "region 0: region at 0x1000 (rkey 0x3) is empty"},
		{"past 2^64", connect.Native, connect.Info{Regions: []connect.Region{{Addr: 1<<63 + 1, Len: 1 << 63}}}, "passes the end of the 64-bit address space"},
		{"rdma-core", connect.RDMACore, connect.Info{Endpoints: atLimit(1), Regions: regionsAtLimit(1)}, "1 regions: rdma-core's exchange carries none"},
		{"rdma-core srq", connect.RDMACoreSRQ, connect.Info{Endpoints: atLimit(1), Regions: regionsAtLimit(1)}, "1 regions: rdma-core's exchange carries none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := withTimeout(t, 10*time.Second)
			_, cli := pair(t, ctx, &connect.Options{Format: tc.f})
			_, err := cli.Exchange(ctx, tc.in)
			require.ErrorIs(t, err, vfrdma.ErrInvalid)
			assert.ErrorContains(t, err, tc.want)
			_, err = tc.in.MarshalBinary()
			if tc.f == connect.Native {
				require.ErrorIs(t, err, vfrdma.ErrInvalid, "MarshalBinary refuses it too")
				assert.ErrorContains(t, err, tc.want)
			}
		})
	}
}

// One past a region's bound, what the peer sends is refused
// (ErrProtocol), with the bound named and the value quoted; at the bound
// it is taken.
func TestOnePastARegionBoundThePeersMessageIsRefused(t *testing.T) {
	good := connect.Endpoint{QPN: 1, GID: gidA}
	eps := []connect.Endpoint{good}
	for _, tc := range []struct {
		name string
		sent []byte
		want string // "" for taken
	}{
		{"regions at the bound", nativeMsg(version, 1, helloRegions(1, eps, connect.MaxRegions, regionsAtLimit(connect.MaxRegions), nil)), ""},
		{"regions one past", nativeMsg(version, 1, helloRegions(1, eps, connect.MaxRegions+1, regionsAtLimit(connect.MaxRegions+1), nil)), "the peer offers 4097 regions, at most 4096"},
		{"length at the bound", nativeMsg(version, 1, helloRegions(1, eps, 1, []connect.Region{{Addr: 5, Len: 1}}, nil)), ""},
		{"length one past", nativeMsg(version, 1, helloRegions(1, eps, 1, []connect.Region{{Addr: 5, Len: 0}}, nil)), "region 0: region at 0x5 (rkey 0x0) is empty"},
		{"end at the bound", nativeMsg(version, 1, helloRegions(1, eps, 1, []connect.Region{{Addr: 0xfffffffffffff000, Len: 0x1000}}, nil)), ""},
		{"end one past", nativeMsg(version, 1, helloRegions(1, eps, 1, []connect.Region{{Addr: 0xfffffffffffff001, Len: 0x1000}}, nil)), "region at 0xfffffffffffff001 of 4096 bytes passes the end of the 64-bit address space"},
		{"data at the bound beside regions", nativeMsg(version, 1, helloRegions(1, eps, 1, regionsAtLimit(1), make([]byte, connect.MaxData))), ""},
		{"data one past beside regions", nativeMsg(version, 1, helloRegions(1, eps, 1, regionsAtLimit(1), make([]byte, connect.MaxData+1))), "65537 bytes of data, at most 65536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fromRawPeer(t, connect.Native, tc.sent, exchange)
			if tc.want == "" {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, connect.ErrProtocol)
				assert.ErrorContains(t, err, tc.want)
			}
			// The same bytes through UnmarshalBinary: the same verdict.
			var in connect.Info
			err = in.UnmarshalBinary(tc.sent)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, connect.ErrProtocol)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// An Info marshals to the native hello, which unmarshals back to it (its
// slices not aliasing the bytes), and survives a text store's base64.
func TestInfoMarshalsToTheNativeHelloAndBack(t *testing.T) {
	in := connect.Info{
		Endpoints: []connect.Endpoint{{QPN: 0x11, GID: gidA, PSN: 3, QKey: 7, MTU: 1024}, {QPN: 0x12, GID: gidA}},
		Regions:   []connect.Region{{Addr: 0x1000, RKey: 0x99, Len: 4096}},
		Data:      []byte("mode=write"),
	}
	b, err := in.MarshalBinary()
	require.NoError(t, err)
	assert.Equal(t, nativeMsg(version, 1, helloRegions(2, in.Endpoints, 1, in.Regions, in.Data)), b, "the bytes are the hello Exchange sends")
	var out connect.Info
	require.NoError(t, out.UnmarshalBinary(b))
	assert.Equal(t, in, out)
	clear(b)
	assert.Equal(t, []byte("mode=write"), out.Data, "the Info does not alias the bytes")

	s := base64.StdEncoding.EncodeToString(mustMarshal(t, in))
	back, err := base64.StdEncoding.DecodeString(s)
	require.NoError(t, err)
	var again connect.Info
	require.NoError(t, again.UnmarshalBinary(back))
	assert.Equal(t, in, again)

	var empty connect.Info
	require.NoError(t, empty.UnmarshalBinary(mustMarshal(t, connect.Info{})))
	assert.Equal(t, connect.Info{}, empty)
}

func mustMarshal(t *testing.T, in connect.Info) []byte {
	t.Helper()
	b, err := in.MarshalBinary()
	require.NoError(t, err)
	return b
}

// What is not one whole hello of this version is refused by
// UnmarshalBinary (ErrProtocol), saying what arrived; the Info is left as
// it was.
func TestUnmarshalBinaryRefusesWhatIsNotOneHello(t *testing.T) {
	hello := mustMarshal(t, connect.Info{Endpoints: []connect.Endpoint{{QPN: 1, GID: gidA}}})
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"nothing", nil, `"" is not a whole hello`},
		{"JSON", []byte(`{"qpn":17}`), `it sent "{\"qpn\":17}"`},
		{"version 1", nativeMsg(1, 1, helloPayload(0, nil, nil)), "version 1 of the exchange, this end 2"},
		{"a barrier", nativeMsg(version, 2, []byte("ready")), "a barrier where a hello was due"},
		{"a refusal", nativeMsg(version, 3, []byte("no")), "a refusal where a hello was due"},
		{"cut", hello[:len(hello)-1], "cut short"},
		{"bytes after", append(append([]byte(nil), hello...), "xyz"...), `3 bytes after the hello: "xyz"`},
		{"QPN 0", nativeMsg(version, 1, helloPayload(1, []connect.Endpoint{{GID: gidA}}, nil)), "endpoint 0: QPN 0x0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := connect.Info{Data: []byte("kept")}
			err := in.UnmarshalBinary(tc.b)
			require.ErrorIs(t, err, connect.ErrProtocol)
			assert.ErrorContains(t, err, tc.want)
			assert.Equal(t, connect.Info{Data: []byte("kept")}, in)
		})
	}
}

// Holds takes a span that ends at the region's end and refuses one a
// byte longer, or starting past it.
func TestRegionHoldsASpanUpToItsEnd(t *testing.T) {
	r := connect.Region{Addr: 0x1000, Len: 64}
	assert.True(t, r.Holds(0, 64))
	assert.True(t, r.Holds(63, 1))
	assert.True(t, r.Holds(64, 0))
	assert.False(t, r.Holds(0, 65))
	assert.False(t, r.Holds(63, 2))
	assert.False(t, r.Holds(65, 0))
	assert.False(t, r.Holds(1, 1<<64-1), "no wrap-around")
}

// A region advertised with RegionOf is where the peer's RDMA WRITE lands:
// its address, rkey and length are the MR's.
func TestAnRDMAWriteLandsInTheRegionThePeerAdvertised(t *testing.T) {
	ctx := withTimeout(t, 30*time.Second)
	fab := pvsim.NewFabric()
	a, b := newEnd(t, ctx, fab, vfrdma.RC), newEnd(t, ctx, fab, vfrdma.RC)
	target, err := b.pd.AllocMR(ctx, 8192, vfrdma.AccessLocalWrite|vfrdma.AccessRemoteWrite)
	require.NoError(t, err)
	assert.Equal(t, connect.Region{Addr: target.Addr(), RKey: target.RKey(), Len: 8192}, connect.RegionOf(target))

	srv, cli := pair(t, ctx, nil)
	var fromA connect.Info
	srvErr, cliErr := both(func() (err error) {
		mine := connect.Info{Endpoints: []connect.Endpoint{{QPN: b.qp.QPN(), GID: b.d.GID(), PSN: b.psn}}, Regions: []connect.Region{connect.RegionOf(target)}}
		if fromA, err = srv.Exchange(ctx, mine); err != nil {
			return err
		}
		if err = b.qp.Connect(ctx, fromA.Endpoints[0].Remote(), b.psn); err != nil {
			return err
		}
		if err = srv.Ready(ctx); err != nil {
			return err
		}
		return srv.Barrier(ctx, "written")
	}, func() error {
		mine := connect.Info{Endpoints: []connect.Endpoint{{QPN: a.qp.QPN(), GID: a.d.GID(), PSN: a.psn}}}
		peer, err := cli.Exchange(ctx, mine)
		if err != nil {
			return err
		}
		if err := a.qp.Connect(ctx, peer.Endpoints[0].Remote(), a.psn); err != nil {
			return err
		}
		if err := cli.Ready(ctx); err != nil {
			return err
		}
		r := peer.Regions[0]
		if !r.Holds(4096, 5) {
			return fmt.Errorf("the region %+v does not hold 5 bytes at 4096", r)
		}
		copy(a.mr.Bytes(), "hello")
		wr := []vfrdma.SendWR{{WRID: 1, Opcode: vfrdma.OpRDMAWrite, SGEs: []vfrdma.SGE{a.mr.SGE(0, 5)}, RemoteAddr: r.Addr + 4096, RKey: r.RKey}}
		if _, err := a.qp.PostSend(wr, 0); err != nil {
			return err
		}
		wcs := make([]vfrdma.WC, 1)
		for n := 0; n == 0; {
			if err := a.cq.Wait(ctx); err != nil {
				return err
			}
			if n, err = a.cq.Poll(wcs); err != nil {
				return err
			}
		}
		if wcs[0].Status != vfrdma.WCSuccess {
			return fmt.Errorf("the WRITE completed %+v", wcs[0])
		}
		return cli.Barrier(ctx, "written")
	})
	require.NoError(t, srvErr)
	require.NoError(t, cliErr)
	assert.Equal(t, "hello", string(target.Bytes()[4096:4101]))
}
