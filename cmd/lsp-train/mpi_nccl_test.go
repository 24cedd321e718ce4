//go:build (cuda || cudasim) && mpi

// The train command under mpirun on the CUDA backend, summing on the
// devices (--collectives): on a GPU box with NCCL, or in every CI run on
// the simulated runtime and its simulated NCCL (-tags "cudasim mpi",
// make cudasim-nccl-test).

package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/cuda"
)

// TestDataParallelNCCLCommand: lsp-train --device cuda under mpirun -np 2
// with --collectives nccl says it sums on the device and exports the same
// weights, bit for bit, as --collectives host and as one process with
// --grad-accum 2; each step's comm_bytes is the host path's (the same
// elements, carried by NCCL); auto picks NCCL.
func TestDataParallelNCCLCommand(t *testing.T) {
	if _, err := cuda.LoadNCCL(); err != nil {
		t.Skipf("SKIP: %v", err)
	}
	if devs, err := cuda.Devices(); err != nil || len(devs) == 0 {
		t.Skipf("SKIP: no CUDA device (%v)", err)
	}
	dir := t.TempDir()
	// dpArgs's run with random projectors (a projector check takes most
	// of a minute on the simulated device).
	args := func(out string, extra ...string) []string {
		return append([]string{"--model", "tiny", "--data", "builtin:sort:300", "--steps", "3", "--batch", "4",
			"--seq-len", "24", "--warmup", "2", "--eval-generate", "2", "--threads", "1", "--mode", "lsp", "--d", "32",
			"--r", "4", "--dense-params", "frozen", "--device", "cuda", "--dtype", "bf16", "--device-mem", "256MiB",
			"--out", out}, extra...)
	}
	one := filepath.Join(dir, "one")
	runChild(t, args(one, "--grad-accum", "2"), "", 0)
	want := readFile(t, one, "hf", "model.safetensors")
	comm := map[string]map[int]float64{}
	for _, tc := range []struct{ collectives, says string }{
		{"host", `sums="on the host (MPI)"`}, {"nccl", `sums="on the device (NCCL)"`}, {"auto", `sums="on the device (NCCL)"`},
	} {
		out := filepath.Join(dir, tc.collectives)
		log, err := runRanks(t, 2, args(out, "--collectives", tc.collectives))
		if err != nil {
			t.Fatalf("mpirun -np 2 --collectives %s: %v\n%s", tc.collectives, err, log)
		}
		if !strings.Contains(log, tc.says) {
			t.Errorf("--collectives %s: the log does not say %s:\n%s", tc.collectives, tc.says, log)
		}
		if got := readFile(t, out, "hf", "model.safetensors"); !bytes.Equal(got, want) {
			t.Errorf("--collectives %s: the weights of mpirun -np 2 differ from one process with --grad-accum 2", tc.collectives)
		}
		comm[tc.collectives] = stepCommBytes(t, out)
	}
	for step, b := range comm["host"] {
		if comm["nccl"][step] != b {
			t.Errorf("step %d: rank 0 sent %g bytes summing on the host, %g on the device", step, b, comm["nccl"][step])
		}
	}
	t.Logf("bytes rank 0 sent per step: host %v, nccl %v", comm["host"], comm["nccl"])
}
