//go:build (cuda || cudasim) && mpi

// Data parallelism with the device communicator (Config.DeviceComm): the
// CUDA backend's NCCL communicator, on a GPU box, or in every CI run on
// the simulated runtime and its simulated NCCL (-tags "cudasim mpi").
// TestDataParallelNCCL launches this test binary under mpirun; each rank
// trains every case twice, summing on the host (MPI) and on the device
// (NCCL), and prints the hashes of both runs' weights and optimizer state
// and what each communicator sent.

package engine

import (
	"fmt"
	"math"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/comm/commtest"
)

func init() { deviceRankMain = ncclRankMain }

// ncclCases are what the device communicator sums: lsp's S (with fitted
// projectors and frozen dense parameters: the same bits as one process
// with --grad-accum N), lsp's dense gradients for the device AdamW, and
// native mode's gradients. The CUDA matmul takes bf16 weights.
func ncclCases() []dpCase {
	frozen, devD := testConfig(LSP), testConfig(LSP)
	frozen.DenseParams = DenseFrozen
	devD.LSP.NoFit = true
	return []dpCase{{"lsp-frozen-fit", frozen, backend.BF16, 0, ""}, {"lsp-device", devD, backend.BF16, -1, ""},
		{"native", testConfig(Native), backend.BF16, -1, ""}}
}

// cudaRanks is the CUDA backend; ranks run under the simulated runtime's
// hazard delays (a no-op on a GPU), so that a missing edge to a device
// collective changes results. nccl, when set, receives the device
// communicator's statistics once its run ends.
func cudaRanks(nccl *comm.Stats) dpEnv {
	env := dpEnv{open: func(rank int, multi bool) (backend.Backend, func() []string, error) {
		delay := time.Duration(0)
		if multi {
			delay = 100 * time.Microsecond
		}
		cuda.SetHazardDelays(uint64(23+rank), delay)
		be, err := cuda.New(cuda.Config{MemBudget: 64 << 20})
		return be, func() []string { return nil }, err
	}}
	if nccl != nil {
		env.dev = func(be backend.Backend, c comm.Communicator) (DeviceComm, func() error, error) {
			n, err := be.(*cuda.Backend).NewNCCL(c)
			if err != nil {
				return nil, nil, err
			}
			return n, func() error {
				*nccl = n.Stats()
				return n.Close()
			}, nil
		}
	}
	return env
}

// ncclRankMain runs every case on this rank, summing on the host and then
// on the device, and prints one line each.
func ncclRankMain(scenario string) int {
	c, nan, ok := dpRankStart(dpDeviceEnv, scenario)
	if !ok {
		return 1
	}
	r := c.Rank()
	for _, tc := range ncclCases() {
		before := c.Stats()
		host, err := dpRunOn(cudaRanks(nil), c, tc, c.Size(), nan)
		if err != nil {
			return commtest.Fail(r, "%s on the host: %v", tc.name, err)
		}
		mid := c.Stats()
		var nccl comm.Stats
		dev, err := dpRunOn(cudaRanks(&nccl), c, tc, c.Size(), nan)
		if err != nil {
			return commtest.Fail(r, "%s on the device: %v", tc.name, err)
		}
		hostMPI, devMPI := mid.Sub(before), c.Stats().Sub(mid)
		fmt.Printf("rank %d %s: host params %s state %s skipped %d loss %x mpi %d | device params %s state %s skipped %d loss %x mpi %d nccl %d calls %d | elems %d\n",
			r, tc.name, host.params, host.state, host.skipped, math.Float64bits(host.loss), hostMPI.Ops[comm.AllReduce].Sent,
			dev.params, dev.state, dev.skipped, math.Float64bits(dev.loss), devMPI.Ops[comm.AllReduce].Sent,
			nccl.Ops[comm.AllReduce].Sent, nccl.Ops[comm.AllReduce].Calls, dev.elems)
	}
	if err := c.Close(); err != nil {
		return commtest.Fail(r, "Close: %v", err)
	}
	return 0
}

// TestDataParallelNCCL: under mpirun -np 2 and -np 3 on the CUDA backend,
// every case's weights and optimizer state are bit for bit the same
// whether the ranks sum on the device (NCCL) or on the host (MPI), on
// every rank; lsp's are those of one process with --grad-accum N; the
// device communicator carries everything but the targets and the flag.
func TestDataParallelNCCL(t *testing.T) {
	if _, err := cuda.LoadNCCL(); err != nil {
		t.Skipf("SKIP: %v", err)
	}
	if devs, err := cuda.Devices(); err != nil || len(devs) == 0 {
		t.Skipf("SKIP: no CUDA device (%v)", err)
	}
	if _, err := exec.LookPath("mpirun"); err != nil {
		t.Skip("SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)")
	}
	for _, np := range []int{2, 3} {
		nan := np - 1
		want := map[string]dpResult{}
		for _, tc := range ncclCases() {
			if tc.tol != 0 {
				continue
			}
			res, err := dpRunOn(cudaRanks(nil), nil, tc, np, nan)
			if err != nil {
				t.Fatalf("%s, one process, --grad-accum %d: %v", tc.name, np, err)
			}
			want[tc.name] = res
		}
		start := time.Now()
		out := runSelf(t, np, 5*time.Minute, dpDeviceEnv+"="+strconv.Itoa(nan))
		for _, tc := range ncclCases() {
			var first []string
			var ncclSent, hostSent, devMPISent int64
			elems := 0
			for r := 0; r < np; r++ {
				re := regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d %s: host params (\w+) state (\w+) skipped (\d+) loss (\w+) mpi (\d+) \| device params (\w+) state (\w+) skipped (\d+) loss (\w+) mpi (\d+) nccl (\d+) calls (\d+) \| elems (\d+)$`,
					r, regexp.QuoteMeta(tc.name)))
				m := re.FindStringSubmatch(out)
				if m == nil {
					t.Fatalf("mpirun -np %d: no result of rank %d for %s; output:\n%s", np, r, tc.name, out)
				}
				host, dev := m[1:5], m[6:10]
				if fmt.Sprint(host) != fmt.Sprint(dev) {
					t.Errorf("mpirun -np %d, %s, rank %d: summed on the device %v, on the host %v", np, tc.name, r, dev, host)
				}
				if dev[2] != "1" {
					t.Errorf("mpirun -np %d, %s, rank %d: %s steps skipped, want 1", np, tc.name, r, dev[2])
				}
				if first == nil {
					first = dev
				} else if dev[0] != first[0] || dev[1] != first[1] {
					t.Errorf("mpirun -np %d, %s: rank %d's weights or state differ from rank 0's", np, tc.name, r)
				}
				if w, ok := want[tc.name]; ok && (dev[0] != w.params || dev[1] != w.state) {
					t.Errorf("mpirun -np %d, %s, rank %d: params %s state %s; one process with --grad-accum %d: params %s state %s",
						np, tc.name, r, dev[0], dev[1], np, w.params, w.state)
				}
				hs, _ := strconv.ParseInt(m[5], 10, 64)
				ds, _ := strconv.ParseInt(m[10], 10, 64)
				ns, _ := strconv.ParseInt(m[11], 10, 64)
				elems, _ = strconv.Atoi(m[13])
				hostSent += hs
				ncclSent += ns
				devMPISent += ds
			}
			// Each attempt sums CommPerStep().Elems elements; on the device
			// all but the targets' count and the flag, which the host
			// communicator sums either way. A sum of n elements sends
			// 2 (np-1) n of them over all ranks.
			per := int64(dpSteps) * 2 * int64(np-1) * 4
			if want := per * int64(elems); hostSent != want {
				t.Errorf("mpirun -np %d, %s: host path sent %d bytes in all-reduces, want %d", np, tc.name, hostSent, want)
			}
			if want := per * int64(elems-2); ncclSent != want {
				t.Errorf("mpirun -np %d, %s: the device communicator sent %d bytes, want %d", np, tc.name, ncclSent, want)
			}
			// cuda.NewNCCL's agreement to start is one more element.
			if want := per*2 + 2*int64(np-1)*4; devMPISent != want {
				t.Errorf("mpirun -np %d, %s: with the device communicator MPI sent %d bytes in all-reduces, want %d (the targets, the flag and the agreement to start)", np, tc.name, devMPISent, want)
			}
			t.Logf("mpirun -np %d, %s: %d elements summed per step, %d of them on the device; bytes sent over all ranks per step: host path %d, device path %d (NCCL) + %d (MPI)",
				np, tc.name, elems, elems-2, hostSent/dpSteps, ncclSent/dpSteps, devMPISent/dpSteps)
		}
		t.Logf("mpirun -np %d: %v\n%s", np, time.Since(start).Round(time.Millisecond), out)
	}
}
