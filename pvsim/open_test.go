package pvsim_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/firmware"
	"github.com/vfrdma/vfrdma/pvsim"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(fabricChildEnv); dir != "" {
		os.Exit(fabricChild(dir)) // a peer process of a fabric test (fabricdir_test.go)
	}
	goleak.VerifyTestMain(m)
}

// devices is the table the driver-level tests run over: QEMU 7.2 and a
// VMware device at every interface version.
var devices = []struct {
	name string
	cfg  pvsim.Config
}{
	{"qemu", pvsim.Config{QEMU: true}},
	{"v17", pvsim.Config{Version: 17}},
	{"v18", pvsim.Config{Version: 18}},
	{"v19", pvsim.Config{Version: 19}},
	{"v20", pvsim.Config{Version: 20}},
	// A device that answers commands late (vector 0 after the REQUEST
	// write returned), as a real one may.
	{"v20-async", pvsim.Config{Version: 20, CommandDelay: 200 * time.Microsecond}},
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// open starts a model and opens the driver on it; both are closed at the
// end of the test.
func open(t testing.TB, cfg pvsim.Config) (*pvsim.Device, *vfrdma.Device) {
	t.Helper()
	m, err := pvsim.New(cfg)
	require.NoError(t, err)
	d, err := vfrdma.OpenFunction(m, &vfrdma.Options{CommandTimeout: 5 * time.Second})
	if err != nil {
		m.Close()
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		assert.NoError(t, d.Close())
		assert.NoError(t, m.Close()) // idempotent: the driver closed it
	})
	return m, d
}

// The driver opens and closes every modelled device, and sees its
// version, capabilities, port and default GID.
func TestOpenClose(t *testing.T) {
	for _, tc := range devices {
		t.Run(tc.name, func(t *testing.T) {
			m, err := pvsim.New(tc.cfg)
			require.NoError(t, err)
			defer m.Close()
			// Through a handle of its own, so that the model outlives the
			// driver's Close and can be inspected after it.
			fn := m.Function()
			d, err := vfrdma.OpenFunction(fn, nil)
			require.NoError(t, err)

			want := uint32(20)
			if tc.cfg.Version != 0 {
				want = tc.cfg.Version
			}
			if tc.cfg.QEMU {
				want = 17
			}
			assert.Equal(t, want, d.Version())
			caps := d.Caps()
			assert.Equal(t, m.Caps().MaxQP, caps.MaxQP)
			assert.Equal(t, uint8(firmware.GIDTypeRoCEv1), caps.GIDTypes)
			assert.Equal(t, pvsim.NodeGUID(m.MAC()), caps.NodeGUID)
			assert.Equal(t, tc.cfg.QEMU, d.Quirks().Emulated, "quirk detection")
			if tc.cfg.QEMU {
				assert.Zero(t, caps.VendorID)
				assert.Equal(t, uint32(28672), caps.MaxCQE)
			} else {
				assert.Equal(t, uint32(0x15ad), caps.VendorID)
				assert.NotZero(t, caps.PageSizeCap)
				assert.Equal(t, uint8(3), caps.AtomicOps)
				assert.NotZero(t, caps.MaxSRQ)
			}
			if want >= 18 {
				assert.NotZero(t, caps.MaxSGERD)
			} else {
				assert.Zero(t, caps.MaxSGERD)
			}

			port, err := d.QueryPort(ctxT(t))
			require.NoError(t, err)
			assert.Equal(t, uint32(firmware.PortActive), port.State)
			if tc.cfg.QEMU {
				assert.Equal(t, uint32(firmware.MTU4096), port.ActiveMTU, "QEMU passes the bench backend's through")
			} else {
				assert.Equal(t, uint32(firmware.MTU1024), port.ActiveMTU)
			}
			assert.Equal(t, vfrdma.GID(m.DefaultGID()), d.GID())
			gids := m.GIDs()
			require.Contains(t, gids, 0)
			assert.Equal(t, m.DefaultGID(), gids[0].GID)

			st := m.State()
			assert.True(t, st.DSRLoaded)
			assert.True(t, st.Activated)

			require.NoError(t, d.Close())
			require.NoError(t, d.Close())
			assert.Empty(t, m.Hazards(), "what QEMU 7.2.0 would crash on")
			o := m.Objects()
			if tc.cfg.QEMU {
				assert.Zero(t, o.GIDs, "unbound")
			} else {
				assert.Equal(t, pvsim.Objects{}, o, "a VMware device is reset at Close")
			}
			_, err = fn.Registers()
			assert.ErrorIs(t, err, pvsim.ErrClosed, "the driver's Close closes the function")
			assert.Empty(t, m.Vectors(), "and disables its vectors")
		})
	}
}

// A RoCE v2 device takes only RoCE v2 GIDs, and the driver binds them so.
func TestRoCEv2Bind(t *testing.T) {
	m, d := open(t, pvsim.Config{Version: 18, RoCEv2: true})
	assert.Equal(t, uint8(firmware.GIDTypeRoCEv2), d.Caps().GIDTypes)
	g, ok := m.GIDs()[0]
	require.True(t, ok, "the default GID is bound")
	assert.Equal(t, uint8(firmware.GIDTypeRoCEv2), g.Type)
}

// The model accepts any GID type when asked to.
func TestRoCEv2AcceptAnyGIDType(t *testing.T) {
	m, _ := open(t, pvsim.Config{Version: 20, RoCEv2: true, AcceptAnyGIDType: true})
	require.Contains(t, m.GIDs(), 0)
}

// Config checks.
func TestConfig(t *testing.T) {
	for _, cfg := range []pvsim.Config{
		{QEMU: true, Version: 20},
		{QEMU: true, RoCEv2: true},
		{Version: 17, RoCEv2: true},
		{CommandDelay: -1},
	} {
		_, err := pvsim.New(cfg)
		assert.Error(t, err, "%+v", cfg)
	}
	m, err := pvsim.New(pvsim.Config{Name: "x", MAC: [6]byte{2, 0, 0, 0, 0, 1}})
	require.NoError(t, err)
	defer m.Close()
	assert.Equal(t, "x", m.Name())
	assert.Equal(t, uint32(20), m.Version())
	assert.Equal(t, uint64(0x000000fffe000001), pvsim.NodeGUID(m.MAC()))
}

// A VMware device that answers commands late: the driver waits for vector
// 0 and the cookie.
func TestOpenAsyncCommands(t *testing.T) {
	m, d := open(t, pvsim.Config{CommandDelay: 2 * time.Millisecond})
	_, err := d.QueryPort(ctxT(t))
	require.NoError(t, err)
	assert.NotZero(t, m.Stats().Interrupts[firmware.VectorResponse])
}

// The driver tells the device where its UAR page is (hw.UARLocator): in
// the 64-bit field from version 19 on.
func TestUARAddress(t *testing.T) {
	m, _ := open(t, pvsim.Config{Version: 19, UARAddress: 1 << 50})
	pfn, err := m.UARPFN()
	require.NoError(t, err)
	assert.Equal(t, uint64(1<<38), pfn)
	assert.Equal(t, pfn, m.State().UARPFN)
	_, err = pvsim.New(pvsim.Config{UARAddress: 123})
	assert.Error(t, err)
}

// A version the driver does not know is reported as it is: the driver
// refuses it.
func TestUnknownVersion(t *testing.T) {
	for _, v := range []uint32{16, 21} {
		m, err := pvsim.New(pvsim.Config{Version: v})
		require.NoError(t, err)
		assert.Equal(t, v, m.Version())
		_, err = vfrdma.OpenFunction(m, nil)
		assert.ErrorIs(t, err, vfrdma.ErrNotSupported, "v%d", v)
		m.Close()
	}
}
