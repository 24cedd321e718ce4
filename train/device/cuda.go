//go:build cuda || cudasim

// The CUDA backend in builds that have it: on a GPU (-tags cuda) or on the
// simulated CUDA runtime (-tags cudasim).

package device

import (
	"errors"
	"fmt"

	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
)

func init() {
	built[CUDA] = openCUDA
	newComm[CUDA] = newNCCL
	perRank[CUDA] = gpuOfRank
}

// gpuOfRank gives local rank r GPU r of its machine: NCCL wants one GPU
// per rank. On the simulated runtime every process has a device 0 of its
// own, so every rank keeps cuda. Without devices, cuda stays as it is and
// opening it says why.
func gpuOfRank(r int) (Kind, error) {
	devs, err := cuda.Devices()
	switch {
	case err != nil || cuda.Simulated():
		return CUDA, nil
	case r >= len(devs):
		return "", fmt.Errorf("cuda: this is rank %d of those mpirun started on this machine, which has %d CUDA device(s): one GPU per rank; start at most %d rank(s) per machine (mpirun -npernode %d), or give each rank its own --device cuda:N",
			r, len(devs), len(devs), len(devs))
	}
	return Kind(fmt.Sprintf("cuda:%d", r)), nil
}

// newNCCL joins the ranks' CUDA backends in an NCCL communicator (on the
// simulated runtime, its simulated NCCL).
func newNCCL(be backend.Backend, c comm.Communicator) (Comm, error) {
	b, ok := be.(*cuda.Backend)
	if !ok {
		return nil, fmt.Errorf("NCCL needs the CUDA backend itself, not %T", be)
	}
	n, err := b.NewNCCL(c)
	if err != nil {
		return nil, err
	}
	return n, nil
}

// openCUDA opens device c.Kind.Ordinal() with an arena of --device-mem
// (the free memory, less CUDA's headroom, when 0). --threads and
// --link-bandwidth are the CPU backend's and change nothing here.
func openCUDA(c Config) (backend.Backend, error) {
	be, err := cuda.New(cuda.Config{Device: c.Kind.Ordinal(), MemBudget: c.MemBudget})
	if errors.Is(err, cuda.ErrNoDevice) {
		return nil, fmt.Errorf("%w; train on the CPU with --device cpu", err)
	}
	if err != nil {
		return nil, err
	}
	return be, nil
}
