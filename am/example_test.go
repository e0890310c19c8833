//go:build !guest

package am_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/vfrdma/vfrdma"
	"github.com/vfrdma/vfrdma/am"
	"github.com/vfrdma/vfrdma/pvsim"
)

// A job of two tasks, each with its own device (two models on one fabric;
// with a NIC, vfrdma.Open("0000:00:10.1", nil)), run here as two
// goroutines where a job runs processes. The tasks find each other through
// an Exchanger: am.LocalExchangers in one process, an am.TCPExchanger
// (one address for the whole job, and a token) across processes. Task 0
// sends a message to task 1, whose header handler says where its data
// goes; the counters tell task 0 when its buffer is free again and when
// task 1's completion handler has run.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fabric := pvsim.NewFabric()
	const tasks = 2
	xs := am.LocalExchangers(tasks)
	got := make(chan string, 1) // what task 1's completion handler saw

	// run is what each task does with its context.
	run := func(c *am.Context) error {
		// Handler 1, the same on every task: the data goes into a buffer
		// of its own; the completion handler runs once it is all in.
		err := c.SetHandler(1, func(a *am.Arrival) am.Return {
			buf, src, uhdr := make([]byte, a.Len), a.Src, string(a.UHdr) // a is valid during the call only
			return am.Return{Buf: buf, Completion: func() {
				got <- fmt.Sprintf("task %d sent %q with header %q", src, buf, uhdr)
			}}
		})
		if err != nil {
			return err
		}
		// Target counter 1 counts the messages whose completion handler
		// ran here; origins name it by its index.
		tgt := am.NewCounter()
		if err := c.SetCounter(1, tgt); err != nil {
			return err
		}
		if err := c.Barrier(ctx); err != nil { // every task's handler is set before anyone sends
			return err
		}
		if c.Self() == 0 {
			org, cmpl := am.NewCounter(), am.NewCounter()
			// The user header is a multiple of 8 bytes.
			if err := c.Amsend(1, 1, []byte("greeting"), []byte("hello, task 1"), am.Counters{Tgt: 1, Org: org, Cmpl: cmpl}); err != nil {
				return err
			}
			if _, err := org.Wait(ctx, 1); err != nil { // the data was copied out: its buffer may be reused
				return err
			}
			if _, err := cmpl.Wait(ctx, 1); err != nil { // task 1's completion handler has run
				return err
			}
		} else if _, err := tgt.Wait(ctx, 1); err != nil {
			return err
		}
		if err := c.Fence(ctx); err != nil { // every message of this task is complete
			return err
		}
		return c.Barrier(ctx) // nobody closes while another task may still send to it
	}
	// task is one task of the job, as each of its processes would run it.
	task := func(self int) error {
		m, err := pvsim.New(pvsim.Config{Fabric: fabric})
		if err != nil {
			return err
		}
		d, err := vfrdma.OpenFunction(m, nil)
		if err != nil {
			return err
		}
		c, err := am.New(ctx, d, am.Config{Tasks: tasks, Self: self, Exchange: xs[self]})
		if err != nil {
			return errors.Join(err, d.Close())
		}
		return errors.Join(run(c), c.Close(), d.Close()) // the context before its device
	}

	errs := make([]error, tasks)
	var wg sync.WaitGroup
	for i := range tasks {
		wg.Go(func() { errs[i] = task(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-got)
	// Output:
	// task 0 sent "hello, task 1" with header "greeting"
}

// A task that srun started takes its rank and size from srun's
// variables and task 0's address from VFRDMA_AM_ADDR (run as
// VFRDMA_AM_ADDR=node01:7470 srun -n 4 ./mysvc). A program passes
// os.Getenv; here a map holds what srun set for the third task of a step
// of four.
func ExampleLauncherExchanger() {
	env := map[string]string{
		"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0",
		"SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4",
		"SLURM_STEP_NODELIST": "node[01-02]", "SLURMD_NODENAME": "node02",
		"VFRDMA_AM_ADDR": "node01:7470",
	}
	x, err := am.LauncherExchanger(func(k string) string { return env[k] })
	if err != nil {
		log.Fatal(err) // errors.Is(err, am.ErrNoLauncher): not started by a launcher
	}
	fmt.Printf("task %d of %d, task 0 at %s\n", x.Self, x.Tasks, x.Addr)
	// Then: am.New(ctx, d, am.Config{Tasks: x.Tasks, Self: x.Self, Exchange: x})
	// Output:
	// task 2 of 4, task 0 at node01:7470
}
