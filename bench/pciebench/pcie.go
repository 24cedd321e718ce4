//go:build cuda || cudasim

// Package pciebench measures the host-device link of CUDA device 0 (make
// bench-pcie): host-to-device, device-to-host and both at once, from
// pinned host memory (cudaHostAlloc, the backend's AllocHost) and from
// pageable Go memory (staged through the backend's pinned staging buffer
// in 4 MiB chunks, as train/backend's Upload and Download do, since the
// Backend contract copies only pinned memory), 4 KiB to 1 GiB. Pinned
// copies are timed by events on their streams; the staged ones by the
// wall clock (their host memcpy is on no stream). Each size runs -runs
// times after a warm-up; the table has the median GB/s, the spread
// ((max-min)/median) and the ratio to the link's theoretical rate, which
// comes from the PCI device's current speed and width in sysfs.
//
// Under -tags cudasim it runs 4 KiB to 1 MiB once, and says the figures
// are simulated: the simulated runtime's copies are memcpy on the CPU.
package pciebench

import (
	"flag"
	"fmt"
	"time"

	"github.com/lsp-offload/lsp-offload/bench/internal/gpubench"
	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// Run parses args (-max, -runs) and measures, printing to stdout. It is a
// package, not only a command, so that the GPU bundle's one binary
// (lsp-train bench-pcie) runs it as bench/pcie does.
func Run(args []string) error {
	fs := flag.NewFlagSet("bench-pcie", flag.ContinueOnError)
	maxSize := fs.Int64("max", 1<<30, "largest copy in bytes (sizes go up by 4x from 4 KiB)")
	runs := fs.Int("runs", 20, "timed runs of each size (after one warm-up)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if simulated {
		*maxSize, *runs = min(*maxSize, 1<<20), 1
	}
	return run(*maxSize, *runs)
}

func run(maxSize int64, runs int) error {
	be, err := gpubench.OpenCUDA("bench-pcie")
	if be == nil || err != nil {
		return err
	}
	defer be.Close()
	link, desc := 0.0, "unknown"
	if d, ok := be.(interface{ Device() cuda.DeviceInfo }); ok {
		fmt.Printf("device: %v\n", d.Device())
		if link, desc, err = gpubench.LinkRate(gpubench.SysfsPCI, d.Device().PCI); err != nil {
			desc = fmt.Sprintf("unknown (%v)", err)
		}
	}
	if simulated {
		fmt.Println("SIMULATED: the simulated CUDA runtime (-tags cudasim) copies with memcpy on the CPU; these are not a GPU's figures")
		link, desc = 0, "none (simulated)"
	}
	fmt.Printf("link: %s", desc)
	if link > 0 {
		fmt.Printf(", %.2f GB/s each way before packet overhead", link/1e9)
	}
	fmt.Printf("\n%d runs per size after a warm-up; GB/s median (spread = (max-min)/median); ratio = median / link\n\n", runs)
	fmt.Printf("%-9s %-20s %9s %7s %6s\n", "size", "copy", "GB/s", "spread", "ratio")
	b := bench{be: be}
	if b.up, err = be.NewStream("bench h2d"); err != nil {
		return err
	}
	if b.down, err = be.NewStream("bench d2h"); err != nil {
		return err
	}
	for _, e := range []*backend.Event{&b.e0, &b.e1, &b.e2} {
		if *e, err = be.NewEvent("bench"); err != nil {
			return err
		}
	}
	for size := int64(4 << 10); size <= maxSize; size *= 4 {
		if err := b.size(size, runs, link); err != nil {
			return fmt.Errorf("%s: %w", human(size), err)
		}
	}
	return nil
}

type bench struct {
	be         backend.Backend
	up, down   backend.Stream
	e0, e1, e2 backend.Event
}

// size measures every kind of copy of n bytes and prints a row each.
func (b *bench) size(n int64, runs int, link float64) error {
	be := b.be
	elems := int(n / 4)
	dA, err := be.Alloc("bench a", elems, backend.F32)
	if err != nil {
		return err
	}
	defer be.Free(dA)
	dB, err := be.Alloc("bench b", elems, backend.F32)
	if err != nil {
		return err
	}
	defer be.Free(dB)
	hA, err := be.AllocHost("bench a", int(n))
	if err != nil {
		return err
	}
	defer be.FreeHost(hA)
	hB, err := be.AllocHost("bench b", int(n))
	if err != nil {
		return err
	}
	defer be.FreeHost(hB)
	page := make([]float32, elems)

	kinds := []struct {
		name  string
		bytes int64
		time  func() (time.Duration, error)
	}{
		{"h2d pinned", n, func() (time.Duration, error) {
			return b.timed(b.up, func() error { return be.CopyH2D(b.up, dA, hA, 0) })
		}},
		{"d2h pinned", n, func() (time.Duration, error) {
			return b.timed(b.down, func() error { return be.CopyD2H(b.down, hB, 0, dB) })
		}},
		{"both pinned", 2 * n, b.both(dA, dB, hA, hB)},
		{"h2d pageable staged", n, func() (time.Duration, error) {
			t0 := time.Now()
			err := backend.Upload(be, b.up, dA, page)
			return time.Since(t0), err
		}},
		{"d2h pageable staged", n, func() (time.Duration, error) {
			t0 := time.Now()
			err := be.Staging().DownloadInto(b.down, page, dB)
			return time.Since(t0), err
		}},
	}
	for _, k := range kinds {
		var rates []float64
		for i := range runs + 1 {
			d, err := k.time()
			if err != nil {
				return fmt.Errorf("%s: %w", k.name, err)
			}
			if i > 0 && d > 0 { // the first warms up
				rates = append(rates, float64(k.bytes)/d.Seconds()/1e9)
			}
		}
		s := gpubench.Summarize(rates)
		ratio := "-"
		if link > 0 {
			per := link
			if k.bytes == 2*n {
				per = 2 * link // both directions at once: full duplex
			}
			ratio = fmt.Sprintf("%.2f", s.Median*1e9/per)
		}
		fmt.Printf("%-9s %-20s %9.3f %7.2f %6s\n", human(n), k.name, s.Median, s.Spread(), ratio)
	}
	return nil
}

// timed runs enqueue on s between two events and returns their elapsed
// time.
func (b *bench) timed(s backend.Stream, enqueue func() error) (time.Duration, error) {
	if err := b.be.Record(b.e0, s); err != nil {
		return 0, err
	}
	if err := enqueue(); err != nil {
		return 0, err
	}
	if err := b.be.Record(b.e1, s); err != nil {
		return 0, err
	}
	if err := b.be.EventSynchronize(b.e1); err != nil {
		return 0, err
	}
	return b.be.ElapsedTime(b.e0, b.e1)
}

// both starts an upload and a download at the same event and times them
// until the later one ends (the up stream waits for the down stream's
// end).
func (b *bench) both(dA, dB backend.Tensor, hA, hB backend.HostBuffer) func() (time.Duration, error) {
	be := b.be
	return func() (time.Duration, error) {
		return b.timed(b.up, func() error {
			if err := be.Record(b.e2, b.up); err != nil {
				return err
			}
			if err := be.Wait(b.down, b.e2); err != nil {
				return err
			}
			if err := be.CopyH2D(b.up, dA, hA, 0); err != nil {
				return err
			}
			if err := be.CopyD2H(b.down, hB, 0, dB); err != nil {
				return err
			}
			if err := be.Record(b.e2, b.down); err != nil {
				return err
			}
			return be.Wait(b.up, b.e2)
		})
	}
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
