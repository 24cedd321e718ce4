//go:build mpi

// The tests launch this test binary under mpirun (runMPI): in a process
// that mpirun started, TestMain runs the scenario named by scenarioEnv on
// that rank instead of the tests, prints what it found and exits; the test
// in the launching process reads the ranks' output and mpirun's exit.

package mpi

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/internal/mpitest"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/comm/commtest"
)

const (
	scenarioEnv = "LSP_COMM_TEST"
	timeoutEnv  = "LSP_COMM_TEST_TIMEOUT"
)

func TestMain(m *testing.M) {
	if _, ok := comm.LaunchedByMPI(); ok && os.Getenv(scenarioEnv) != "" {
		os.Exit(rankMain())
	}
	os.Exit(m.Run())
}

// rankMain runs one rank of a scenario; its exit code is mpirun's business.
func rankMain() int {
	cfg := Config{}
	if v := os.Getenv(timeoutEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Printf("FAIL: %s=%q: %v\n", timeoutEnv, v, err)
			return 1
		}
		cfg.Timeout = d
	}
	c, err := Init(cfg)
	if err != nil {
		fmt.Printf("FAIL: Init: %v\n", err)
		return 1
	}
	r := c.Rank()
	fmt.Printf("rank %d pid %d\n", r, os.Getpid())
	scenario := os.Getenv(scenarioEnv)
	switch scenario {
	case "collectives":
		n, err := checkCollectives(c)
		if err != nil {
			return commtest.Fail(r, "%v", err)
		}
		if err := c.Close(); err != nil {
			return commtest.Fail(r, "Close: %v", err)
		}
		commtest.PrintPassed(r, c.Size(), n)
		return 0
	case "kill", "killidle":
		// A survivor that has printed stays until mpirun's SIGKILL: one
		// that exited would be a second lost rank to the other, which
		// may look only then.
		survive := func() int {
			time.Sleep(30 * time.Second)
			return 3
		}
		if scenario == "killidle" {
			return killIdle(c, survive)
		}
		if r != 1 {
			// As a training command that stops gracefully on SIGTERM
			// would: the collective must still fail, naming rank 1,
			// within the second before mpirun's SIGKILL.
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGTERM)
			go func() {
				<-sig
				fmt.Printf("rank %d: got SIGTERM, goes on\n", r)
			}()
		}
		x := make([]float32, 1000)
		deadline := time.Now().Add(90 * time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			if r == 1 && i == 3 {
				fmt.Printf("rank 1: killing itself (SIGKILL)\n")
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
			if err := c.AllReduceSum(x); err != nil {
				fmt.Printf("rank %d: error: %v\n", r, err)
				var lost *LostError
				if errors.As(err, &lost) {
					fmt.Printf("rank %d: LostError.Ranks %v, Ended %v\n", r, lost.Ranks, lost.Ended)
				}
				return survive()
			}
		}
		return commtest.Fail(r, "still running after 90 s")
	case "stall":
		if r != 1 {
			// What the stuck collective waits for, from another
			// goroutine, half a second into the wait.
			go func() {
				for {
					time.Sleep(20 * time.Millisecond)
					if w, ok := c.(*Comm).Waiting(); ok && w.For >= 500*time.Millisecond {
						fmt.Printf("rank %d: waiting for %v in %s\n", r, w.Ranks, w.Op)
						return
					}
				}
			}()
		}
		x := make([]float32, 1000)
		for i := 0; ; i++ {
			if r == 1 && i == 2 {
				fmt.Printf("rank 1: stops calling collectives\n")
				time.Sleep(5 * time.Minute)
				return 1
			}
			err := c.AllReduceSum(x)
			if err == nil {
				continue
			}
			var lost *LostError
			if !errors.As(err, &lost) {
				return commtest.Fail(r, "not a LostError: %v", err)
			}
			fmt.Printf("rank %d: error: %v\n", r, err)
			fmt.Printf("rank %d: LostError.Ranks %v\n", r, lost.Ranks)
			if err2 := c.Barrier(); err2 != err {
				return commtest.Fail(r, "Barrier after the error: %v, want the same error", err2)
			}
			if err2 := c.Close(); err2 != err {
				return commtest.Fail(r, "Close after the error: %v, want the same error", err2)
			}
			return 3
		}
	case "mismatch":
		err := c.AllReduceSum(make([]float32, 5+r))
		if err == nil {
			return commtest.Fail(r, "no error")
		}
		fmt.Printf("rank %d: error: %v\n", r, err)
		return 3
	case "bench":
		// By hand, not in the tests: LSP_COMM_TEST=bench mpirun -np N
		// <test binary>: the all-reduce's time on 1M..16M floats.
		for _, n := range []int{1 << 20, 4 << 20, 16 << 20} {
			x := make([]float32, n)
			reps := 5
			c.Barrier()
			t0 := time.Now()
			for i := 0; i < reps; i++ {
				if err := c.AllReduceSum(x); err != nil {
					return commtest.Fail(r, "%v", err)
				}
			}
			el := time.Since(t0) / time.Duration(reps)
			if r == 0 {
				fmt.Printf("AllReduceSum of %d floats (%d MB) on %d ranks: %v, %.2f GB/s of buffer\n",
					n, 4*n>>20, c.Size(), el.Round(time.Microsecond), float64(4*n)/el.Seconds()/1e9)
			}
		}
		c.Close()
		return 0
	}
	fmt.Printf("FAIL: unknown scenario %q\n", scenario)
	return 1
}

// killIdle is the killidle scenario: rank 1 dies while the others are
// outside any collective; they learn of it from mpirun's SIGTERM, and Lost
// names it.
func killIdle(c comm.Communicator, survive func() int) int {
	r := c.Rank()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	x := make([]float32, 1000)
	for i := 0; i < 3; i++ {
		if err := c.AllReduceSum(x); err != nil {
			return commtest.Fail(r, "%v", err)
		}
	}
	if r == 1 {
		fmt.Printf("rank 1: killing itself (SIGKILL)\n")
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	select {
	case <-sig:
	case <-time.After(90 * time.Second):
		return commtest.Fail(r, "no SIGTERM in 90 s")
	}
	err := c.(*Comm).Lost()
	fmt.Printf("rank %d: SIGTERM: Lost: %v\n", r, err)
	var lost *LostError
	if errors.As(err, &lost) {
		fmt.Printf("rank %d: LostError.Ranks %v, Ended %v\n", r, lost.Ranks, lost.Ended)
	}
	return survive()
}

// checkCollectives runs every collective on ragged sizes against the same
// result computed here in one process, bit for bit, with the bytes each
// call must count; it returns how many checks passed.
func checkCollectives(c comm.Communicator) (int, error) {
	size, rank := c.Size(), c.Rank()
	checks := 0
	sizes := []int{0, 1, 2, size - 1, size, size + 1, 7, 1000, 4099}
	run := func(what string, n, k int) error {
		parts := make([][]float32, size)
		for r := range parts {
			parts[r] = commtest.Input(r, n, k)
		}
		want := make([]float32, n)
		if err := comm.SumInRankOrder(want, parts...); err != nil {
			return err
		}
		lo, hi := comm.Shard(n, size, rank)
		mine := hi - lo
		hdr := int64(0)
		if size > 1 {
			hdr = 2 * int64(size-1) * 24
		}

		// All-reduce, and its bytes: this rank's shard of every other
		// rank, then its sum to every other rank.
		before := c.Stats()
		x := append([]float32(nil), parts[rank]...)
		if err := c.AllReduceSum(x); err != nil {
			return fmt.Errorf("%s AllReduceSum(%d): %w", what, n, err)
		}
		if err := commtest.SameBits(x, want); err != nil {
			return fmt.Errorf("%s AllReduceSum(%d): %v", what, n, err)
		}
		d := c.Stats().Sub(before)
		wantBytes := 4 * int64(n-mine+(size-1)*mine)
		if o := d.Ops[comm.AllReduce]; o.Calls != 1 || o.Sent != wantBytes || o.Received != wantBytes || d.Control != hdr {
			return fmt.Errorf("%s AllReduceSum(%d): stats %+v control %d, want 1 call, %d bytes each way, %d of headers",
				what, n, o, d.Control, wantBytes, hdr)
		}
		checks += 2

		// Reduce-scatter.
		before = c.Stats()
		shard := make([]float32, mine)
		x = append([]float32(nil), parts[rank]...)
		if err := c.ReduceScatterSum(shard, x); err != nil {
			return fmt.Errorf("%s ReduceScatterSum(%d): %w", what, n, err)
		}
		if err := commtest.SameBits(shard, want[lo:hi]); err != nil {
			return fmt.Errorf("%s ReduceScatterSum(%d): %v", what, n, err)
		}
		if err := commtest.SameBits(x, parts[rank]); err != nil {
			return fmt.Errorf("%s ReduceScatterSum(%d) changed x: %v", what, n, err)
		}
		d = c.Stats().Sub(before)
		if o := d.Ops[comm.ReduceScatter]; o.Sent != 4*int64(n-mine) || o.Received != 4*int64((size-1)*mine) {
			return fmt.Errorf("%s ReduceScatterSum(%d): stats %+v", what, n, o)
		}
		checks += 2

		// All-gather of every rank's own input shard, from a separate
		// shard and in place.
		gathered := make([]float32, n)
		for r := 0; r < size; r++ {
			rlo, rhi := comm.Shard(n, size, r)
			copy(gathered[rlo:rhi], parts[r][rlo:rhi])
		}
		before = c.Stats()
		y := make([]float32, n)
		if err := c.AllGather(y, parts[rank][lo:hi]); err != nil {
			return fmt.Errorf("%s AllGather(%d): %w", what, n, err)
		}
		if err := commtest.SameBits(y, gathered); err != nil {
			return fmt.Errorf("%s AllGather(%d): %v", what, n, err)
		}
		d = c.Stats().Sub(before)
		if o := d.Ops[comm.AllGather]; o.Sent != 4*int64((size-1)*mine) || o.Received != 4*int64(n-mine) {
			return fmt.Errorf("%s AllGather(%d): stats %+v", what, n, o)
		}
		y = make([]float32, n)
		copy(y[lo:hi], parts[rank][lo:hi])
		if err := c.AllGather(y, y[lo:hi]); err != nil {
			return fmt.Errorf("%s AllGather(%d) in place: %w", what, n, err)
		}
		if err := commtest.SameBits(y, gathered); err != nil {
			return fmt.Errorf("%s AllGather(%d) in place: %v", what, n, err)
		}
		checks += 3

		// Broadcast from every root.
		for root := 0; root < size; root++ {
			b := make([]byte, n)
			if rank == root {
				for i := range b {
					b[i] = byte(i*7 + root)
				}
			}
			before = c.Stats()
			if err := c.Broadcast(b, root); err != nil {
				return fmt.Errorf("%s Broadcast(%d, root %d): %w", what, n, root, err)
			}
			for i := range b {
				if b[i] != byte(i*7+root) {
					return fmt.Errorf("%s Broadcast(%d, root %d): byte %d is %d", what, n, root, i, b[i])
				}
			}
			o := c.Stats().Sub(before).Ops[comm.Broadcast]
			ws, wr := int64(0), int64(n)
			if rank == root {
				ws, wr = int64((size-1)*n), 0
			}
			if o.Sent != ws || o.Received != wr {
				return fmt.Errorf("%s Broadcast(%d, root %d): stats %+v, want %d sent, %d received", what, n, root, o, ws, wr)
			}
			checks++
		}
		return nil
	}
	for _, n := range sizes {
		if n < 0 {
			continue
		}
		if err := run("", n, 0); err != nil {
			return checks, err
		}
	}
	// Shards longer than one message go in rounds: 3 floats a message.
	saved := maxMsg
	maxMsg = 12
	for _, n := range []int{0, 1, 5, 17, 100} {
		if err := run("(3-float messages)", n, 1); err != nil {
			maxMsg = saved
			return checks, err
		}
	}
	maxMsg = saved

	// The check can fail: with three ranks or more, another order of the
	// same sum gives other bits somewhere.
	if size >= 3 {
		parts := make([][]float32, size)
		rev := make([][]float32, size)
		for r := range parts {
			parts[r] = commtest.Input(r, 1000, 0)
			rev[size-1-r] = parts[r]
		}
		a, b := make([]float32, 1000), make([]float32, 1000)
		comm.SumInRankOrder(a, parts...)
		comm.SumInRankOrder(b, rev...)
		if commtest.SameBits(a, b) == nil {
			return checks, fmt.Errorf("the reverse order gives the same bits: the inputs cannot tell orders apart")
		}
		checks++
	}

	// Typed broadcasts (a projector's indices and values).
	idx := []int32{0, 0, 0}
	val := []float32{0, 0}
	if rank == size-1 {
		idx = []int32{3, -1, 1 << 30}
		val = []float32{1.5, float32(math.Inf(-1))}
	}
	if err := comm.BroadcastInt32(c, idx, size-1); err != nil {
		return checks, err
	}
	if err := comm.BroadcastFloat32(c, val, size-1); err != nil {
		return checks, err
	}
	if idx[2] != 1<<30 || idx[1] != -1 || val[0] != 1.5 || !math.IsInf(float64(val[1]), -1) {
		return checks, fmt.Errorf("typed broadcasts: %v %v", idx, val)
	}
	checks++

	if err := c.Barrier(); err != nil {
		return checks, err
	}
	checks++

	// A nil dereference is still Go's panic after MPI_Init (Open MPI's
	// signal handlers are off).
	if err := func() (err error) {
		defer func() {
			if recover() == nil {
				err = errors.New("a nil dereference did not panic")
			}
		}()
		var p *int
		return fmt.Errorf("read %d", *p)
	}(); err != nil {
		return checks, err
	}
	checks++

	// Summed over ranks, the bytes sent equal the bytes received.
	st := c.Stats()
	mine := []float32{float32(st.Sent()), float32(st.Received())}
	all := make([]float32, 2*size)
	if err := c.AllGather(all, mine); err != nil {
		return checks, err
	}
	var sent, recv float64
	for r := 0; r < size; r++ {
		sent += float64(all[2*r])
		recv += float64(all[2*r+1])
	}
	if sent != recv || (size > 1 && sent == 0) {
		return checks, fmt.Errorf("over all ranks %v bytes sent, %v received", sent, recv)
	}
	checks++

	// Misuse is refused before any message.
	if err := c.Broadcast(nil, size); err == nil {
		return checks, errors.New("Broadcast from root size: no error")
	}
	if err := c.ReduceScatterSum(make([]float32, 1000), make([]float32, 1000)); size > 1 && err == nil {
		return checks, errors.New("ReduceScatterSum with a full-length shard: no error")
	}
	checks++
	return checks, nil
}

// runMPI runs this test binary under mpirun with np ranks in scenario; it
// returns the output (stdout and stderr), the exit error and the time.
func runMPI(t *testing.T, np int, scenario string, env ...string) (out string, err error, start time.Time) {
	t.Helper()
	start = time.Now()
	out, err, _ = mpitest.Run(t, np, 2*time.Minute, append([]string{scenarioEnv + "=" + scenario}, env...))
	return out, err, start
}

func TestCollectives(t *testing.T) {
	for _, np := range []int{1, 2, 3} {
		out, err, start := runMPI(t, np, "collectives")
		el := time.Since(start)
		if err != nil {
			t.Fatalf("mpirun -np %d: %v; output:\n%s", np, err, out)
		}
		commtest.CheckPassed(t, np, out)
		t.Logf("mpirun -np %d: %v\n%s", np, el.Round(time.Millisecond), out)
	}
}

// pids are the process ids the ranks printed.
func pids(out string) []int {
	var ps []int
	for _, m := range regexp.MustCompile(`(?m)^rank \d+ pid (\d+)$`).FindAllStringSubmatch(out, -1) {
		p, _ := strconv.Atoi(m[1])
		ps = append(ps, p)
	}
	return ps
}

// gone waits until every rank's process has ended (a zombie counts as
// ended: only its parent's wait is missing), at most until limit after
// start, and fails the test for those that did not.
func gone(t *testing.T, out string, np int, start time.Time, limit time.Duration) {
	ps := pids(out)
	if len(ps) != np {
		t.Errorf("%d ranks printed their pid, want %d; output:\n%s", len(ps), np, out)
	}
	running := func(p int) bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			return false
		}
		// The state follows the command's closing parenthesis.
		s := string(b)
		i := strings.LastIndex(s, ")")
		return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
	}
	for _, p := range ps {
		for running(p) && time.Since(start) < limit {
			time.Sleep(20 * time.Millisecond)
		}
		if running(p) {
			t.Errorf("rank process %d still runs %v after the start", p, limit)
		}
	}
	t.Logf("every rank ended within %v of the start", time.Since(start).Round(time.Millisecond))
}

// TestKilledRank kills rank 1 of 3 in the middle of a loop of all-reduces:
// the other two, which catch SIGTERM and go on, must each fail their
// all-reduce with their own error naming rank 1 as ended (before mpirun's
// SIGKILL, a second after its SIGTERM), and the job must end non-zero
// within 60 s.
func TestKilledRank(t *testing.T) {
	lostRank(t, "kill", "with rank 1 killed", nil,
		`(?m)^rank %[1]d: error: comm/mpi: rank %[1]d of 3: AllReduceSum #\d+ of 1000 elements: lost rank 1: its process ended \(pid \d+ on \S+\)$`,
		"rank %d: LostError.Ranks [1], Ended true\n")
}

// TestKilledRankIdle kills rank 1 of 3 while the others are between
// collectives: on mpirun's SIGTERM, Lost must name rank 1 at once.
func TestKilledRankIdle(t *testing.T) {
	lostRank(t, "killidle", "with rank 1 killed between collectives", nil,
		`(?m)^rank %[1]d: SIGTERM: Lost: comm/mpi: rank %[1]d of 3: lost rank 1: its process ended \(pid \d+ on \S+\)$`,
		"rank %d: LostError.Ranks [1], Ended true\n")
}

// TestStalledRank stops rank 1 of 3 from calling collectives without
// ending it: the others must fail with an error naming rank 1 after the
// timeout, and the job must end.
func TestStalledRank(t *testing.T) {
	lostRank(t, "stall", "with rank 1 stalled", []string{timeoutEnv + "=2s"},
		`(?m)^rank %[1]d: error: comm/mpi: rank %[1]d of 3: AllReduceSum #3 of 1000 elements: lost rank 1: nothing received from rank 1`,
		"rank %d: LostError.Ranks [1]\n", "rank %d: waiting for [1] in AllReduceSum #3 of 1000 elements\n")
}

// lostRank runs scenario on 3 ranks, in which rank 1 is lost (how says
// how, for the log): mpirun must exit non-zero within 60 s; ranks 0 and 2
// must each print a line matching lineRE and every one of lines (both
// formatted with the rank), and no rank may fail; every rank's process
// must end.
func lostRank(t *testing.T, scenario, how string, env []string, lineRE string, lines ...string) {
	t.Helper()
	out, err, start := runMPI(t, 3, scenario, env...)
	el := time.Since(start)
	t.Logf("mpirun -np 3 %s: %v, %v\n%s", how, el.Round(time.Millisecond), err, out)
	if err == nil {
		t.Fatal("mpirun exited 0")
	}
	if el > 60*time.Second {
		t.Errorf("took %v, want under 60 s", el)
	}
	for _, r := range []int{0, 2} {
		re := fmt.Sprintf(lineRE, r)
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("no line matching %q", re)
		}
		for _, line := range lines {
			if line := fmt.Sprintf(line, r); !strings.Contains(out, line) {
				t.Errorf("rank %d: no line %q", r, line)
			}
		}
	}
	if strings.Contains(out, "FAIL") {
		t.Error("a rank failed")
	}
	gone(t, out, 3, start, 60*time.Second)
}

// TestMismatch has rank 0 all-reduce 5 elements and rank 1 six: each must
// say what the other is doing.
func TestMismatch(t *testing.T) {
	out, err, _ := runMPI(t, 2, "mismatch", timeoutEnv+"=20s")
	t.Logf("%v\n%s", err, out)
	for r := 0; r < 2; r++ {
		line := fmt.Sprintf("rank %d: error: comm/mpi: rank %d of 2: AllReduceSum #1 of %d elements: rank %d is in AllReduceSum #1 of %d elements",
			r, r, 5+r, 1-r, 6-r)
		if !strings.Contains(out, line) {
			t.Errorf("no line %q", line)
		}
	}
	if strings.Contains(out, "FAIL") {
		t.Error("a rank failed")
	}
}
