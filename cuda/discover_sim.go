//go:build cudasim

// Device discovery on the simulated CUDA runtime: the driver API (and so
// package cu, which links libcuda) is not there, so the devices come from
// the runtime's cudaGetDeviceCount and cudaGetDeviceProperties.

package cuda

/*
#include <cuda_runtime_api.h>
*/
import "C"

import "fmt"

// devices lists the simulated devices; an error wrapping ErrNoDevice when
// the runtime reports none.
func devices() ([]DeviceInfo, error) {
	var n C.int
	if err := rtErr("cudaGetDeviceCount", C.int(C.cudaGetDeviceCount(&n))); err != nil {
		return nil, fmt.Errorf("cuda: %w: %v", ErrNoDevice, err)
	}
	devs := make([]DeviceInfo, int(n))
	for i := range devs {
		var p C.struct_cudaDeviceProp
		if err := rtErr("cudaGetDeviceProperties", C.int(C.cudaGetDeviceProperties(&p, C.int(i)))); err != nil {
			return nil, fmt.Errorf("cuda: querying device %d: %w", i, err)
		}
		devs[i] = DeviceInfo{Ordinal: i, Name: C.GoString(&p.name[0]), Major: int(p.major), Minor: int(p.minor),
			TotalMem: int64(p.totalGlobalMem), SMs: int(p.multiProcessorCount),
			PCI: fmt.Sprintf("%04x:%02x:%02x", int(p.pciDomainID), int(p.pciBusID), int(p.pciDeviceID))}
	}
	return devs, nil
}
