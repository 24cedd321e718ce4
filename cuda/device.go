// What a device is and whether the kernels can run on it, without CUDA:
// the discovery in discover_cu.go (GPU) and discover_sim.go (simulated
// runtime) fills DeviceInfo, and CheckCapability refuses what the kernels
// cannot run on, so the refusal is tested with a made-up device.

package cuda

import (
	"errors"
	"fmt"
)

// The oldest compute capability the kernels run on: sm_80 (Ampere), the
// first with bf16 tensor cores (wmma bf16 16x16x16), which the GEMM and
// attention kernels need.
const (
	MinMajor = 8
	MinMinor = 0
)

// DeviceInfo describes one CUDA device.
type DeviceInfo struct {
	Ordinal      int    // as cudaSetDevice numbers it (cuda:N)
	Name         string // e.g. "NVIDIA H100 80GB HBM3"
	Major, Minor int    // compute capability
	TotalMem     int64  // bytes of device memory
	SMs          int    // multiprocessors
	// PCI is domain:bus:device, e.g. "0000:3b:00" ("" when unknown).
	PCI string
}

// Arch is the capability as nvcc spells it, e.g. sm_90.
func (d DeviceInfo) Arch() string { return fmt.Sprintf("sm_%d%d", d.Major, d.Minor) }

func (d DeviceInfo) String() string {
	s := fmt.Sprintf("device %d (%s, %s, %.1f GiB", d.Ordinal, d.Name, d.Arch(), float64(d.TotalMem)/(1<<30))
	if d.SMs > 0 {
		s += fmt.Sprintf(", %d SMs", d.SMs)
	}
	if d.PCI != "" {
		s += ", PCI " + d.PCI
	}
	return s + ")"
}

// CheckCapability says whether the kernels run on d: nil, or an error
// naming the device and its capability.
func CheckCapability(d DeviceInfo) error {
	if d.Major > MinMajor || d.Major == MinMajor && d.Minor >= MinMinor {
		return nil
	}
	return fmt.Errorf("cuda: device %d (%s) has compute capability %d.%d (%s); the kernels need sm_%d%d or newer (bf16 tensor cores)",
		d.Ordinal, d.Name, d.Major, d.Minor, d.Arch(), MinMajor, MinMinor)
}

// ErrNoDevice is wrapped by the error of a machine with no usable CUDA
// device (no driver, no GPU, or none the runtime can open), so callers can
// tell "no device here" from a device that failed.
var ErrNoDevice = errors.New("no CUDA device found")

// pick returns the device of the given ordinal among those found, or why
// it cannot be used.
func pick(devs []DeviceInfo, ordinal int) (DeviceInfo, error) {
	if len(devs) == 0 {
		return DeviceInfo{}, fmt.Errorf("cuda: %w", ErrNoDevice)
	}
	if ordinal < 0 || ordinal >= len(devs) {
		return DeviceInfo{}, fmt.Errorf("cuda: device %d does not exist: this machine has %d CUDA device(s), cuda:0 to cuda:%d",
			ordinal, len(devs), len(devs)-1)
	}
	d := devs[ordinal]
	if err := CheckCapability(d); err != nil {
		return DeviceInfo{}, err
	}
	return d, nil
}

// OutOfMemoryError is an allocation that did not fit: the device arena in
// the device's free memory (a real out-of-memory, from cudaMalloc), or a
// buffer in the --device-mem budget or in the arena.
type OutOfMemoryError struct {
	Device string // DeviceInfo.String()
	What   string // the arena, or the buffer's name
	Asked  int64  // bytes asked for
	Free   int64  // bytes free where they were asked for
	Where  string // where Free was measured, e.g. "on the device (of 80 GiB)"
	Hint   string // what to change, or CUDA's error
}

func (e *OutOfMemoryError) Error() string {
	s := fmt.Sprintf("cuda: out of memory on %s allocating %s: asked %d bytes (%s), %d bytes (%s) free %s",
		e.Device, e.What, e.Asked, mib(e.Asked), e.Free, mib(e.Free), e.Where)
	if e.Hint != "" {
		s += "; " + e.Hint
	}
	return s
}

func mib(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }
