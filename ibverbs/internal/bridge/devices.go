package bridge

import (
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
)

// Env is what the library reads from its environment.
type Env struct {
	Model  string
	Device string
	Debug  bool
	Sysfs  string
}

// EnvFrom reads the environment through getenv (os.Getenv).
func EnvFrom(getenv func(string) string) Env {
	d := getenv(EnvDebug)
	return Env{
		Model:  strings.TrimSpace(getenv(EnvModel)),
		Device: strings.TrimSpace(getenv(EnvDevice)),
		Debug:  d != "" && d != "0",
		Sysfs:  getenv(EnvSysfs),
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

// ParseModel parses VFRDMA_MODEL: v17..v20 (vmware is v20) or qemu, with
// ",rocev2" for RoCE v2 GIDs.
func ParseModel(spec string) (pvsim.Config, error) {
	var cfg pvsim.Config
	parts := strings.Split(strings.ToLower(spec), ",")
	switch v := parts[0]; {
	case v == "qemu":
		cfg.QEMU = true
	case v == "vmware":
		cfg.Version = pvsim.VersionQPHandle
	case strings.HasPrefix(v, "v"):
		n, err := strconv.Atoi(v[1:])
		if err != nil || n < int(pvsim.VersionRoCEv1) || n > int(pvsim.VersionQPHandle) {
			return cfg, fmt.Errorf("%w: %s=%q: the version is v17 to v20", errInvalid, EnvModel, spec)
		}
		cfg.Version = uint32(n)
	default:
		return cfg, fmt.Errorf("%w: %s=%q: want v17..v20, vmware or qemu, with ,rocev2 optional", errInvalid, EnvModel, spec)
	}
	for _, opt := range parts[1:] {
		if opt != "rocev2" {
			return cfg, fmt.Errorf("%w: %s=%q: unknown option %q (rocev2 is the one)", errInvalid, EnvModel, spec, opt)
		}
		cfg.RoCEv2 = true
	}
	return cfg, nil
}
