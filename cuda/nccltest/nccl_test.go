//go:build cuda || cudasim

package nccltest

import (
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/internal/mpitest"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/comm/commtest"
	"github.com/lsp-offload/lsp-offload/train/comm/mpi"
)

// rankEnv names the scenario a process that mpirun started runs
// (rankMain): "collectives", or a lost rank ("abort", "kill", "stall").
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
	if simulated && err == nil && len(devs) > 0 {
		return devs // every rank's process has its own simulated device 0
	}
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

// runMPI runs this test binary under mpirun with np ranks in scenario; it
// returns the output (stdout and stderr), the exit error and the time, and
// fails the test when mpirun is still running after 3 minutes.
func runMPI(t *testing.T, np int, scenario string, env ...string) (string, error, time.Duration) {
	t.Helper()
	if !mpi.Built {
		t.Skip("SKIP: NCCL between processes needs this test built with -tags \"cuda mpi\" (or \"cudasim mpi\")")
	}
	return mpitest.Run(t, np, 3*time.Minute, append([]string{rankEnv + "=" + scenario}, env...))
}

// TestNCCLRanks runs rankMain under mpirun, one rank per GPU (up to 3); on
// the simulated runtime, where every rank's process has its own simulated
// device, with 2 and then 3 ranks.
func TestNCCLRanks(t *testing.T) {
	devs := usable(t, 2)
	nps := []int{min(len(devs), 3)}
	if simulated {
		nps = []int{2, 3}
	}
	for _, np := range nps {
		out, err, el := runMPI(t, np, "collectives")
		if err != nil {
			t.Fatalf("mpirun -np %d: %v; output:\n%s", np, err, out)
		}
		commtest.CheckPassed(t, np, out)
		t.Logf("mpirun -np %d: %v\n%s", np, el.Round(time.Millisecond), out)
	}
}

// TestNCCLLostRank loses rank 1 of 3 in the middle of a loop of
// all-reduces: it aborts its communicator (ncclCommAbort: its sockets
// close, as a dead process's do), dies (SIGKILL), or stops issuing NCCL
// work while it lives. Ranks 0 and 2 must each get an error from the
// stream they wait on, naming the cause, not hang: at once for the first
// two, after the simulated NCCL's timeout (LSP_CUDASIM_NCCL_TIMEOUT, 2 s
// here) for the stalled rank. Real NCCL gives no such error by itself (a
// watchdog must poll NCCL.Err and abort), so this runs on the simulated
// runtime only.
func TestNCCLLostRank(t *testing.T) {
	if !simulated {
		t.Skip("SKIP: a lost peer ends a wait with an error on the simulated NCCL only (real NCCL needs a watchdog)")
	}
	usable(t, 1)
	if !mpi.Built {
		t.Skip("SKIP: NCCL between processes needs this test built with -tags \"cudasim mpi\"")
	}
	for _, tc := range []struct {
		scenario string
		cause    string // in every survivor's error
		limit    time.Duration
	}{
		{"abort", `closed its connection|failed earlier`, 20 * time.Second},
		{"kill", `closed its connection|failed earlier`, 20 * time.Second},
		{"stall", `no progress for 2s|closed its connection`, 20 * time.Second},
		// Rank 1 all-reduces 1002 elements, the others 1000: every rank's
		// shards differ from what its peers send.
		{"mismatch", `has \d+ bytes, but the matching receive of this rank wants \d+|closed its connection|failed earlier`, 20 * time.Second},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			out, err, el := runMPI(t, 3, tc.scenario, "LSP_CUDASIM_NCCL_TIMEOUT=2")
			t.Logf("mpirun -np 3, rank 1 %s: %v, %v\n%s", tc.scenario, el.Round(time.Millisecond), err, out)
			if tc.scenario == "kill" {
				if err == nil {
					t.Error("mpirun exited 0 although rank 1 was killed")
				}
			} else if err != nil {
				t.Errorf("mpirun: %v", err)
			}
			if strings.Contains(out, "FAIL") {
				t.Error("a rank failed")
			}
			survivors := []int{0, 2}
			if tc.scenario == "mismatch" {
				survivors = []int{0, 1, 2}
				if !strings.Contains(out, "the ranks issue different operations") {
					t.Error("no rank said that the ranks issue different operations")
				}
			}
			for _, r := range survivors {
				if !regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d: NCCL.Err: cuda: NCCL: `, r)).MatchString(out) {
					t.Errorf("rank %d: NCCL.Err reports no asynchronous error after the failure", r)
				}
				if m := regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d: aborted in (\S+)$`, r)).FindStringSubmatch(out); m == nil {
					t.Errorf("rank %d: did not abort its communicator", r)
				} else if d, err := time.ParseDuration(m[1]); err != nil || d > 5*time.Second {
					t.Errorf("rank %d: ncclCommAbort took %s", r, m[1])
				}
				m := regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d: error after (\S+) at all-reduce #(\d+): (.*)$`, r)).FindStringSubmatch(out)
				if m == nil {
					t.Errorf("rank %d printed no error", r)
					continue
				}
				if !regexp.MustCompile(tc.cause).MatchString(m[3]) {
					t.Errorf("rank %d's error does not match %q: %s", r, tc.cause, m[3])
				}
				if d, err := time.ParseDuration(m[1]); err != nil || d > tc.limit {
					t.Errorf("rank %d: error after %s, want under %v", r, m[1], tc.limit)
				}
				if want := map[bool]string{true: "0", false: "3"}[tc.scenario == "mismatch"]; m[2] != want {
					t.Errorf("rank %d: the error came at all-reduce #%s, want #%s (the first that went wrong)", r, m[2], want)
				}
			}
		})
	}
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
		return commtest.Fail(r, "devices: %d, %v", len(devs), err)
	}
	scenario := os.Getenv(rankEnv)
	if scenario == "collectives" {
		// Seeded delays before every queued op of the simulated runtime
		// (a no-op on a GPU): work that no event orders runs out of order.
		cuda.SetHazardDelays(uint64(r)+1, 300*time.Microsecond)
	}
	be, err := cuda.New(cuda.Config{Device: r % len(devs), MemBudget: 256 << 20})
	if err != nil {
		return commtest.Fail(r, "%v", err)
	}
	n, err := be.NewNCCL(c)
	if err != nil {
		return commtest.Fail(r, "%v", err)
	}
	if scenario != "collectives" {
		return lostRank(scenario, c, be, n)
	}
	checks, err := check(be, n)
	if err != nil {
		return commtest.Fail(r, "%v", err)
	}
	// The communicator, then the device it runs on, then MPI.
	for _, closeOne := range []func() error{n.Close, be.Close, c.Close} {
		if err := closeOne(); err != nil {
			return commtest.Fail(r, "%v", err)
		}
	}
	commtest.PrintPassed(r, c.Size(), checks)
	return 0
}

// lostRank runs a scenario of TestNCCLLostRank: all-reduces in a loop, in
// which rank 1 is lost before the fourth (#3); the others print the error
// their stream gives and how long after the all-reduce was enqueued.
func lostRank(scenario string, c comm.Communicator, be *cuda.Backend, n *cuda.NCCL) int {
	r := c.Rank()
	if scenario == "kill" && r != 1 {
		// mpirun ends the job when rank 1 dies (SIGTERM, then SIGKILL):
		// the survivors hold on to print what NCCL told them.
		signal.Ignore(syscall.SIGTERM)
	}
	s := be.DefaultStream()
	L := 1000
	if scenario == "mismatch" && r == 1 {
		L = 1002 // from all-reduce #0 on: shards of 334 elements, not 333
	}
	x, err := be.Alloc("x", L, backend.F32)
	if err != nil {
		return commtest.Fail(r, "%v", err)
	}
	sc, err := be.Alloc("scratch", comm.ReduceScratch(L, n.Size()), backend.F32)
	if err != nil {
		return commtest.Fail(r, "%v", err)
	}
	in := commtest.Input(r, L, 0)
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		if r == 1 && i == 3 && scenario != "mismatch" {
			switch scenario {
			case "abort":
				fmt.Printf("rank 1: aborts its communicator\n")
				if err := n.Abort(); err != nil {
					return commtest.Fail(r, "Abort: %v", err)
				}
			case "kill":
				fmt.Printf("rank 1: killing itself (SIGKILL)\n")
				os.Stdout.Sync()
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			case "stall":
				fmt.Printf("rank 1: stops issuing NCCL work for 3.5 s\n")
				time.Sleep(3500 * time.Millisecond)
				if err := n.Close(); err != nil {
					return commtest.Fail(r, "Close: %v", err)
				}
			}
			// The survivors meet rank 1 again on MPI, then all end.
			if err := c.Barrier(); err != nil {
				return commtest.Fail(r, "Barrier: %v", err)
			}
			fmt.Printf("rank 1: done\n")
			c.Close()
			return 0
		}
		t0 := time.Now()
		if err := backend.Upload(be, s, x, in); err != nil {
			return lostError(r, i, t0, err, scenario, c, n)
		}
		if err := n.AllReduceSum(s, x, sc); err != nil {
			return lostError(r, i, t0, err, scenario, c, n)
		}
		if _, err := backend.Download(be, s, x); err != nil {
			return lostError(r, i, t0, err, scenario, c, n)
		}
	}
	return commtest.Fail(r, "still running after 60 s")
}

// lostError reports the error of a survivor, then NCCL's asynchronous
// error, and aborts the communicator (which must not wait for the lost
// rank).
func lostError(r, i int, t0 time.Time, err error, scenario string, c comm.Communicator, n *cuda.NCCL) int {
	fmt.Printf("rank %d: error after %v at all-reduce #%d: %v\n", r, time.Since(t0).Round(time.Millisecond), i, err)
	fmt.Printf("rank %d: NCCL.Err: %v\n", r, n.Err())
	t1 := time.Now()
	if err := n.Abort(); err != nil {
		return commtest.Fail(r, "Abort: %v", err)
	}
	fmt.Printf("rank %d: aborted in %v\n", r, time.Since(t1).Round(time.Millisecond))
	os.Stdout.Sync()
	if scenario == "kill" {
		time.Sleep(30 * time.Second) // until mpirun ends the job
		return 3
	}
	if err := c.Barrier(); err != nil {
		return commtest.Fail(r, "Barrier: %v", err)
	}
	c.Close()
	return 0
}

// checkOrdered all-reduces on a stream of its own, ordered by events
// after the upload on another stream and before the download on a third,
// as the engine enqueues it: a collective that ran before its input was
// uploaded, or a download before the sum, would not give the rank-order
// sum (on the simulated runtime, rankMain turns the hazard delays on, so
// work not ordered by an event runs out of order).
func checkOrdered(be *cuda.Backend, n *cuda.NCCL) (int, error) {
	size, rank := n.Size(), n.Rank()
	const L = 70001
	parts := make([][]float32, size)
	for r := range parts {
		parts[r] = commtest.Input(r+100, L, 0)
	}
	want := make([]float32, L)
	if err := comm.SumInRankOrder(want, parts...); err != nil {
		return 0, err
	}
	var streams [3]backend.Stream
	var events [2]backend.Event
	for i := range streams {
		s, err := be.NewStream(fmt.Sprintf("ordered%d", i))
		if err != nil {
			return 0, err
		}
		defer be.DestroyStream(s)
		streams[i] = s
	}
	for i := range events {
		e, err := be.NewEvent(fmt.Sprintf("ordered%d", i))
		if err != nil {
			return 0, err
		}
		defer be.DestroyEvent(e)
		events[i] = e
	}
	up, cs, down := streams[0], streams[1], streams[2]
	x, err := be.Alloc("ordered x", L, backend.F32)
	if err != nil {
		return 0, err
	}
	defer be.Free(x)
	sc, err := be.Alloc("ordered scratch", comm.ReduceScratch(L, size), backend.F32)
	if err != nil {
		return 0, err
	}
	defer be.Free(sc)
	in, err := be.Alloc("ordered input", L, backend.F32)
	if err != nil {
		return 0, err
	}
	defer be.Free(in)
	if err := backend.Upload(be, up, in, parts[rank]); err != nil {
		return 0, err
	}
	checks := 0
	for round := 0; round < 3; round++ {
		// The input reaches x through copies queued on up (an upload may
		// return only once it is done): under the hazard delays they end
		// milliseconds after the all-reduce was enqueued.
		for i := 0; i < 16; i++ {
			if err := be.CopyD2D(up, x, in); err != nil {
				return checks, err
			}
		}
		if err := be.Record(events[0], up); err != nil {
			return checks, err
		}
		if err := be.Wait(cs, events[0]); err != nil {
			return checks, err
		}
		if err := n.AllReduceSum(cs, x, sc); err != nil {
			return checks, err
		}
		if err := be.Record(events[1], cs); err != nil {
			return checks, err
		}
		if err := be.Wait(down, events[1]); err != nil {
			return checks, err
		}
		got, err := backend.Download(be, down, x)
		if err != nil {
			return checks, err
		}
		if err := sameBits(fmt.Sprintf("AllReduceSum(%d) ordered by events, round %d", L, round), got, want); err != nil {
			return checks, err
		}
		checks++
	}
	return checks, nil
}

// sameBits says where a and b, what, differ, bit for bit, or returns nil.
func sameBits(what string, a, b []float32) error {
	if err := commtest.SameBits(a, b); err != nil {
		return fmt.Errorf("%s: %w", what, err)
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
	// 1<<18+3 elements (1 MiB) are more than a socket buffer of the
	// simulated NCCL holds: its sends and receives must progress together.
	for _, L := range []int{0, 1, 2, size - 1, size, size + 1, 7, 1000, 4099, 1<<18 + 3} {
		if L < 0 {
			continue
		}
		parts := make([][]float32, size)
		for r := range parts {
			parts[r] = commtest.Input(r, L, 0)
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
		sc, err := alloc("scratch", comm.ReduceScratch(L, size))
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
	ordered, err := checkOrdered(be, n)
	if err != nil {
		return checks, err
	}
	checks += ordered
	st := n.Stats()
	if size > 1 && (st.Sent() == 0 || st.Ops[comm.AllReduce].Calls == 0) {
		return checks, fmt.Errorf("stats %+v", st)
	}
	return checks, nil
}
