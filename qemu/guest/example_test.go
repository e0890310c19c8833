package guest_test

import (
	"context"
	"log"
	"path/filepath"
	"time"

	"github.com/vfrdma/vfrdma/qemu/guest"
)

// Building an image that loads the VFIO modules, binds the pvrdma function
// and runs one package's in-guest tests.
func Example() {
	ctx := context.Background()
	root, out := "/path/to/vfrdma", "/tmp/bench"
	k, err := guest.FindKernel(root)
	if err != nil {
		log.Fatal(err) // "guest kernel not found in …: run `make setup`"
	}
	if err := guest.ExtractVmlinux(ctx, k); err != nil {
		log.Print(err) // k.Image() stays vmlinuz: slower, still fine
	}
	initBin, testBin := filepath.Join(out, "init"), filepath.Join(out, "vfio.test")
	if err := guest.BuildInit(ctx, root, initBin); err != nil {
		log.Fatal(err)
	}
	if err := guest.BuildTestBinary(ctx, filepath.Join(root, "vfio"), testBin); err != nil {
		log.Fatal(err)
	}
	err = guest.WriteInitramfs(filepath.Join(out, "initramfs.cpio"), guest.Spec{
		Init:       initBin,
		Kernel:     k,
		BindPVRDMA: true,
		Programs: []guest.Program{
			{Name: "vfio.test", HostPath: testBin, Kind: guest.KindGoTest, Timeout: 2 * time.Minute},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	// Boot k.Image() with -initrd initramfs.cpio.
}
