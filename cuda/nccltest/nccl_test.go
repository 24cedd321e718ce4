//go:build cuda

package nccltest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/comm/mpi"
)

const rankEnv = "LSP_NCCL_TEST"

func TestMain(m *testing.M) {
	if _, ok := comm.LaunchedByMPI(); ok && os.Getenv(rankEnv) != "" {
		os.Exit(rankMain())
	}
	os.Exit(m.Run())
}

// TestLoadNCCL loads libnccl.so.2, or checks that the error says which
// library is missing (every machine without NCCL, CI's included).
func TestLoadNCCL(t *testing.T) {
	v, err := cuda.LoadNCCL()
	if err != nil {
		if !strings.Contains(err.Error(), cuda.NCCLLibrary) {
			t.Fatalf("LoadNCCL: %v, want it to name %s", err, cuda.NCCLLibrary)
		}
		t.Skipf("SKIP: %v", err)
	}
	t.Logf("%s: version code %d", cuda.NCCLLibrary, v)
}

// usable returns the devices, or skips the test saying what is missing.
func usable(t *testing.T, need int) []cuda.DeviceInfo {
	t.Helper()
	if _, err := cuda.LoadNCCL(); err != nil {
		t.Skipf("SKIP: %v", err)
	}
	devs, err := cuda.Devices()
	if err != nil || len(devs) < need {
		t.Skipf("SKIP: NCCL's test needs %d CUDA device(s): found %d (%v)", need, len(devs), err)
	}
	return devs
}

func TestNCCLOneRank(t *testing.T) {
	usable(t, 1)
	be, err := cuda.New(cuda.Config{MemBudget: 256 << 20})
	if err != nil {
		t.Skipf("SKIP: %v", err)
	}
	defer be.Close()
	n, err := be.NewNCCL(comm.NewSingle())
	if err != nil {
		t.Fatal(err)
	}
	checks, err := check(be, n)
	if err != nil {
		t.Fatal(err)
	}
	// Misuse is an error, not a crash.
	x, _ := be.Alloc("x", 8, backend.BF16)
	sc, _ := be.Alloc("scratch", 8, backend.F32)
	if err := n.AllReduceSum(be.DefaultStream(), x, sc); err == nil || !strings.Contains(err.Error(), "want F32") {
		t.Errorf("BF16 all-reduce: %v", err)
	}
	y, _ := be.Alloc("y", 16, backend.F32)
	if err := n.AllReduceSum(be.DefaultStream(), y, sc); err == nil || !strings.Contains(err.Error(), "ReduceScratch") {
		t.Errorf("short scratch: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.AllGather(be.DefaultStream(), y, y); err == nil {
		t.Error("AllGather after Close: no error")
	}
	t.Logf("%d checks passed", checks)
}

// TestNCCLRanks runs rankMain under mpirun, one rank per GPU (up to 3).
func TestNCCLRanks(t *testing.T) {
	devs := usable(t, 2)
	if !mpi.Built {
		t.Skip("SKIP: NCCL between processes needs this test built with -tags \"cuda mpi\"")
	}
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("SKIP: mpirun not found")
	}
	np := min(len(devs), 3)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args := []string{"--oversubscribe", "--bind-to", "none", "-np", strconv.Itoa(np), os.Args[0]}
	if os.Geteuid() == 0 {
		args = append([]string{"--allow-run-as-root"}, args...)
	}
	cmd := exec.CommandContext(ctx, mpirun, args...)
	cmd.Env = append(os.Environ(), rankEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mpirun -np %d: %v; output:\n%s", np, err, out)
	}
	for r := 0; r < np; r++ {
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d of %d: \d+ checks passed$`, r, np)).Match(out) {
			t.Fatalf("rank %d did not pass; output:\n%s", r, out)
		}
	}
	t.Logf("%s", out)
}

func rankMain() int {
	c, err := mpi.Init(mpi.Config{})
	if err != nil {
		fmt.Printf("FAIL: %v\n", err)
		return 1
	}
	r := c.Rank()
	devs, err := cuda.Devices()
	if err != nil || len(devs) == 0 {
		fmt.Printf("rank %d: FAIL: devices: %d, %v\n", r, len(devs), err)
		return 1
	}
	be, err := cuda.New(cuda.Config{Device: r % len(devs), MemBudget: 256 << 20})
	if err != nil {
		fmt.Printf("rank %d: FAIL: %v\n", r, err)
		return 1
	}
	n, err := be.NewNCCL(c)
	if err != nil {
		fmt.Printf("rank %d: FAIL: %v\n", r, err)
		return 1
	}
	checks, err := check(be, n)
	if err != nil {
		fmt.Printf("rank %d: FAIL: %v\n", r, err)
		return 1
	}
	if err := n.Close(); err != nil {
		fmt.Printf("rank %d: FAIL: %v\n", r, err)
		return 1
	}
	if err := be.Close(); err != nil {
		fmt.Printf("rank %d: FAIL: %v\n", r, err)
		return 1
	}
	if err := c.Close(); err != nil {
		fmt.Printf("rank %d: FAIL: %v\n", r, err)
		return 1
	}
	fmt.Printf("rank %d of %d: %d checks passed\n", r, c.Size(), checks)
	return 0
}

// input is rank r's values for n elements (as train/comm/mpi's tests).
func input(r, n int) []float32 {
	rng := rand.New(rand.NewPCG(uint64(r), uint64(n)))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(41)-20))
	}
	return x
}

func sameBits(what string, a, b []float32) error {
	if len(a) != len(b) {
		return fmt.Errorf("%s: %d elements, want %d", what, len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return fmt.Errorf("%s: element %d is %v, want %v", what, i, a[i], b[i])
		}
	}
	return nil
}

// check runs every collective of n on ragged sizes against the rank-order
// sums of the host.
func check(be *cuda.Backend, n *cuda.NCCL) (int, error) {
	size, rank := n.Size(), n.Rank()
	s := be.DefaultStream()
	checks := 0
	alloc := func(name string, k int) (backend.Tensor, error) {
		t, err := be.Alloc(name, max(k, 1), backend.F32)
		return t.Slice(0, k), err
	}
	put := func(t backend.Tensor, v []float32) error {
		if len(v) == 0 {
			return nil
		}
		return backend.Upload(be, s, t, v)
	}
	get := func(t backend.Tensor) ([]float32, error) {
		if t.Len() == 0 {
			return nil, be.Synchronize(s)
		}
		return backend.Download(be, s, t)
	}
	for _, L := range []int{0, 1, 2, size - 1, size, size + 1, 7, 1000, 4099} {
		if L < 0 {
			continue
		}
		parts := make([][]float32, size)
		for r := range parts {
			parts[r] = input(r, L)
		}
		want := make([]float32, L)
		if err := comm.SumInRankOrder(want, parts...); err != nil {
			return checks, err
		}
		lo, hi := comm.Shard(L, size, rank)
		x, err := alloc("x", L)
		if err != nil {
			return checks, err
		}
		sc, err := alloc("scratch", cuda.ReduceScratch(L, size))
		if err != nil {
			return checks, err
		}
		sh, err := alloc("shard", hi-lo)
		if err != nil {
			return checks, err
		}
		if err := put(x, parts[rank]); err != nil {
			return checks, err
		}
		if err := n.AllReduceSum(s, x, sc); err != nil {
			return checks, err
		}
		got, err := get(x)
		if err != nil {
			return checks, err
		}
		if err := sameBits(fmt.Sprintf("AllReduceSum(%d)", L), got, want); err != nil {
			return checks, err
		}
		if err := put(x, parts[rank]); err != nil {
			return checks, err
		}
		if err := n.ReduceScatterSum(s, sh, x, sc); err != nil {
			return checks, err
		}
		if got, err = get(sh); err != nil {
			return checks, err
		}
		if err := sameBits(fmt.Sprintf("ReduceScatterSum(%d)", L), got, want[lo:hi]); err != nil {
			return checks, err
		}
		// The shard of the sum, gathered, is the sum.
		y, err := alloc("y", L)
		if err != nil {
			return checks, err
		}
		if err := n.AllGather(s, y, sh); err != nil {
			return checks, err
		}
		if got, err = get(y); err != nil {
			return checks, err
		}
		if err := sameBits(fmt.Sprintf("AllGather(%d)", L), got, want); err != nil {
			return checks, err
		}
		for root := 0; root < size; root++ {
			if err := put(x, parts[rank]); err != nil {
				return checks, err
			}
			if err := n.Broadcast(s, x, root); err != nil {
				return checks, err
			}
			if got, err = get(x); err != nil {
				return checks, err
			}
			if err := sameBits(fmt.Sprintf("Broadcast(%d, root %d)", L, root), got, parts[root]); err != nil {
				return checks, err
			}
		}
		for _, t := range []backend.Tensor{x, sc, sh, y} {
			be.Free(t)
		}
		checks += 3 + size
	}
	st := n.Stats()
	if size > 1 && (st.Sent() == 0 || st.Ops[comm.AllReduce].Calls == 0) {
		return checks, fmt.Errorf("stats %+v", st)
	}
	return checks, nil
}
