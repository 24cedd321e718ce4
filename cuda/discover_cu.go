//go:build cuda

// Device discovery on a GPU, through the driver API of
// github.com/barnex/cuda5/cu: count, name, compute capability, memory and
// PCI ids, the queries it covers without touching the primary context the
// runtime uses (cuInit and the cuDevice* calls make no context current).
// cu panics on every error; each call is recovered here and returned as an
// error, so no panic leaves the package.

package cuda

// #include <cuda.h>
import "C"

import (
	"fmt"

	"github.com/barnex/cuda5/cu"
)

// cuDo runs f and returns a panic of cu as an error saying what was asked.
func cuDo(what string, f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: %v", what, r)
		}
	}()
	f()
	return nil
}

// devices lists the devices of this machine; an error wrapping ErrNoDevice
// when the driver has none to offer (no driver, no GPU, a broken install).
func devices() ([]DeviceInfo, error) {
	n := 0
	if err := cuDo("cuInit", func() { cu.Init(0); n = cu.DeviceGetCount() }); err != nil {
		return nil, fmt.Errorf("cuda: %w: the driver says %v", ErrNoDevice, err)
	}
	devs := make([]DeviceInfo, n)
	for i := range devs {
		d := &devs[i]
		d.Ordinal = i
		err := cuDo(fmt.Sprintf("device %d", i), func() {
			dev := cu.DeviceGet(i)
			d.Name = dev.Name()
			d.Major, d.Minor = dev.ComputeCapability()
			d.TotalMem = dev.TotalMem()
			d.SMs = dev.Attribute(cu.MULTIPROCESSOR_COUNT)
			domain := dev.Attribute(cu.DeviceAttribute(C.CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID))
			d.PCI = fmt.Sprintf("%04x:%02x:%02x", domain, dev.Attribute(cu.PCI_BUS_ID), dev.Attribute(cu.PCI_DEVICE_ID))
		})
		if err != nil {
			return nil, fmt.Errorf("cuda: querying %w", err)
		}
	}
	return devs, nil
}
