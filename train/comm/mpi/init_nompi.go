//go:build !mpi

package mpi

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/comm"
)

// Built reports whether this binary has MPI (-tags mpi).
const Built = false

// Init returns the one-process communicator, or an error when mpirun
// launched this process: a binary built without -tags mpi cannot join the
// job, and running N copies that each train alone would be wrong.
func Init(cfg Config) (comm.Communicator, error) {
	if n, ok := comm.LaunchedByMPI(); ok {
		return nil, fmt.Errorf("comm/mpi: launched by mpirun (%s=%d), but this binary was built without MPI (build it with -tags mpi, which needs libopenmpi-dev)",
			comm.WorldEnv, n)
	}
	return comm.NewSingle(), nil
}
