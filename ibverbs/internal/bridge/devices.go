package bridge

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/vfrdma/vfrdma/pci"
	"github.com/vfrdma/vfrdma/pvsim"
)

// The environment variables the library reads.
const (
	EnvModel  = "VFRDMA_MODEL"  // v17..v20 or qemu (",rocev2" optional): one device, a model in the process
	EnvDevice = "VFRDMA_DEVICE" // a PCI address: list only that function
	EnvDebug  = "VFRDMA_DEBUG"  // 1: diagnostics on stderr
	EnvSysfs  = "VFRDMA_SYSFS"  // the sysfs root ("" means /sys); for tests
	// EnvFabric, with EnvModel, puts the model on the fabric of a
	// directory that the models of other processes naming it share
	// (pvsim.JoinFabric): two programs on the host then talk RDMA.
	EnvFabric = "VFRDMA_FABRIC"
	// EnvPollPace sets the POLL doorbell's pace on an empty poll
	// (vfrdma.Options.PollPace): a Go duration, "every" (or any negative
	// duration) for every empty poll, as rdma-core's provider rings it;
	// unset, the driver's default.
	EnvPollPace = "VFRDMA_POLL_PACE"
)

// Env is what the library reads from its environment.
type Env struct {
	Model  string
	Device string
	Debug  bool
	Sysfs  string
	Fabric string
	// PollPace is EnvPollPace's value, checked at Open.
	PollPace string
}

// EnvFrom reads the environment through getenv (os.Getenv).
func EnvFrom(getenv func(string) string) Env {
	d := getenv(EnvDebug)
	return Env{
		Model:    strings.TrimSpace(getenv(EnvModel)),
		Device:   strings.TrimSpace(getenv(EnvDevice)),
		Debug:    d != "" && d != "0",
		Sysfs:    getenv(EnvSysfs),
		Fabric:   strings.TrimSpace(getenv(EnvFabric)),
		PollPace: strings.TrimSpace(getenv(EnvPollPace)),
	}
}

// Logf prints a diagnostic on w when debugging is on, and nothing otherwise.
func (e Env) Logf(w io.Writer, format string, args ...any) {
	if e.Debug && w != nil {
		fmt.Fprintf(w, "vfrdma: "+format+"\n", args...)
	}
}

// DeviceInfo is one entry of the device list.
type DeviceInfo struct {
	Name  string // vfrdma0, vfrdma1, ...
	BDF   string // the PCI address; "" for a model
	Model string // the model spec; "" for a PCI function
}

// Devices lists what ibv_get_device_list returns: with Model set, one
// device vfrdma0 that is a model; otherwise the pvrdma functions
// (15ad:0820) bound to vfio-pci, in PCI address order, named vfrdma0,
// vfrdma1, ..., or only the one Device names. No function (or no sysfs)
// is an empty list; a bad Model is an error.
func Devices(env Env) ([]DeviceInfo, error) {
	if env.Model != "" {
		if _, err := ParseModel(env.Model); err != nil {
			return nil, err
		}
		return []DeviceInfo{{Name: "vfrdma0", Model: env.Model}}, nil
	}
	fns, err := pci.NewBus(env.Sysfs).Find(pci.VendorVMware, pci.DevicePVRDMA)
	if err != nil {
		return nil, nil
	}
	var bdfs []string
	for _, f := range fns {
		if f.Driver == "vfio-pci" {
			bdfs = append(bdfs, f.Addr.String())
		}
	}
	slices.Sort(bdfs)
	var out []DeviceInfo
	for _, b := range bdfs {
		if env.Device != "" && !sameBDF(env.Device, b) {
			continue
		}
		out = append(out, DeviceInfo{Name: "vfrdma" + strconv.Itoa(len(out)), BDF: b})
	}
	return out, nil
}

// sameBDF compares a user's address (domain optional) with sysfs's.
func sameBDF(user, bdf string) bool {
	user = strings.ToLower(user)
	return user == bdf || "0000:"+user == bdf
}

// ParseModel parses VFRDMA_MODEL (pvsim.ParseSpec).
func ParseModel(spec string) (pvsim.Config, error) {
	cfg, err := pvsim.ParseSpec(spec)
	var se *pvsim.SpecError
	if errors.As(err, &se) {
		return cfg, fmt.Errorf("%w: %s=%q: %s", errInvalid, EnvModel, spec, se.Reason)
	}
	return cfg, err
}
