//go:build !mpi

package mpi

import (
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/comm"
)

func TestInitWithoutMPI(t *testing.T) {
	t.Setenv(comm.WorldEnv, "2")
	if _, err := Init(Config{}); err == nil || !strings.Contains(err.Error(), "built without MPI") {
		t.Errorf("under mpirun without -tags mpi: err = %v", err)
	}
}

func TestInitSingle(t *testing.T) {
	if _, ok := comm.LaunchedByMPI(); ok {
		t.Skip("launched by mpirun")
	}
	c, err := Init(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Size() != 1 || c.Rank() != 0 {
		t.Errorf("size %d rank %d", c.Size(), c.Rank())
	}
	if err := c.Close(); err != nil {
		t.Error(err)
	}
}
