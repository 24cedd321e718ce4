// Package gpubench holds what the GPU microbenchmarks (bench/pcie,
// bench/kernels) share and what needs no GPU: the statistics of repeated
// timings and the theoretical rate of a device's PCIe link, read from
// Linux's sysfs (no NVML: the link's current speed and width are files of
// the PCI device there).
package gpubench

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/device"
)

// Stats are repeated measures of one figure.
type Stats struct {
	Median, Min, Max float64
	N                int
}

// Summarize is the median, minimum and maximum of v.
func Summarize(v []float64) Stats {
	if len(v) == 0 {
		return Stats{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Stats{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// Spread is (max - min) / median: how far apart the runs were.
func (s Stats) Spread() float64 {
	if s.Median == 0 {
		return 0
	}
	return (s.Max - s.Min) / s.Median
}

// SysfsPCI is where Linux lists PCI devices.
const SysfsPCI = "/sys/bus/pci/devices"

// LinkRate is the theoretical payload rate in bytes/s, each way, of the
// PCIe link of the device at pci ("0000:3b:00", function 0 assumed, as
// CUDA reports it; or with its function) under the sysfs directory dir:
// its current speed per lane times its current width, less the line
// encoding (8b/10b up to 5 GT/s, 128b/130b from 8 GT/s, the FLIT mode's
// 242/256 at 64 GT/s). Packet headers cost a further 5 to 15% that this
// does not count. desc says what was read, e.g. "PCIe 4.0 x16
// (16.0 GT/s)".
func LinkRate(dir, pci string) (rate float64, desc string, err error) {
	if pci == "" {
		return 0, "", fmt.Errorf("pcie: the device reports no PCI address")
	}
	if strings.Count(pci, ".") == 0 {
		pci += ".0"
	}
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, strings.ToLower(pci), name))
		if err != nil {
			return "", fmt.Errorf("pcie: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	speed, err := read("current_link_speed")
	if err != nil {
		return 0, "", err
	}
	width, err := read("current_link_width")
	if err != nil {
		return 0, "", err
	}
	f := strings.Fields(speed) // "16.0 GT/s PCIe" or "16 GT/s"
	if len(f) < 2 || f[1] != "GT/s" {
		return 0, "", fmt.Errorf("pcie: %s: current_link_speed %q is not N GT/s", pci, speed)
	}
	gts, err := strconv.ParseFloat(f[0], 64)
	if err != nil || gts <= 0 {
		return 0, "", fmt.Errorf("pcie: %s: current_link_speed %q is not N GT/s", pci, speed)
	}
	w, err := strconv.Atoi(strings.TrimPrefix(width, "x"))
	if err != nil || w <= 0 {
		return 0, "", fmt.Errorf("pcie: %s: current_link_width %q is not a lane count", pci, width)
	}
	gen, enc := "", 128.0/130
	switch {
	case gts <= 2.5:
		gen, enc = "1", 8.0/10
	case gts <= 5:
		gen, enc = "2", 8.0/10
	case gts <= 8:
		gen = "3"
	case gts <= 16:
		gen = "4"
	case gts <= 32:
		gen = "5"
	default:
		gen, enc = "6", 242.0/256
	}
	return gts * 1e9 * enc / 8 * float64(w), fmt.Sprintf("PCIe %s.0 x%d (%g GT/s)", gen, w, gts), nil
}

// OpenCUDA opens CUDA device 0 for the benchmark name; without a device
// it prints one line saying nothing was measured and returns nil, nil
// (a machine without a GPU is not a failure of the benchmark).
func OpenCUDA(name string) (backend.Backend, error) {
	be, err := device.Open(device.Config{Kind: device.CUDA})
	if errors.Is(err, cuda.ErrNoDevice) {
		fmt.Printf("%s: no CUDA device (%v): nothing measured\n", name, err)
		return nil, nil
	}
	return be, err
}

// Main runs a benchmark command's run with the command line's arguments,
// as bench/kernels and bench/pcie do: -h exits 0 after the usage, any other
// error is printed after name and exits 1.
func Main(name string, run func(args []string) error) {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
