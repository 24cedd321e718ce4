//go:build mpi

// Data parallelism over Open MPI (dp.go), tested as train/comm/mpi's
// tests are: TestDataParallelMatchesAccum launches this test binary under
// mpirun; in a process that mpirun started, TestMain runs one rank of the
// scenario named by dpScenarioEnv instead of the tests, prints the hashes
// of its weights and optimizer state, and exits. The launching test
// computes the same run in one process with --grad-accum N over the same
// global batches and compares the hashes bit for bit.

package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/internal/mpitest"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/comm/commtest"
	"github.com/lsp-offload/lsp-offload/train/comm/mpi"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/faults"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
)

const (
	dpScenarioEnv = "LSP_DP_TEST"
	dpDeviceEnv   = "LSP_DP_DEVICE_TEST" // the device communicator's scenario (dp_nccl_test.go)
	dpOutEnv      = "LSP_DP_OUT"         // where rank 0 writes the weights of the inexact cases
)

// dpSteps is the number of step attempts of every run; dpNaNStep is the
// step whose loss and gradients are NaN on one rank (on its micro-batch in
// the single process), skipped everywhere.
const (
	dpSteps   = 6
	dpNaNStep = 3
)

func TestMain(m *testing.M) {
	if _, ok := comm.LaunchedByMPI(); ok && os.Getenv(dpScenarioEnv) != "" {
		os.Exit(dpRankMain(os.Getenv(dpScenarioEnv)))
	}
	if _, ok := comm.LaunchedByMPI(); ok && os.Getenv(dpDeviceEnv) != "" && deviceRankMain != nil {
		os.Exit(deviceRankMain(os.Getenv(dpDeviceEnv)))
	}
	os.Exit(m.Run())
}

// deviceRankMain runs one rank of the device communicator's scenario, in
// builds that have one (dp_nccl_test.go).
var deviceRankMain func(scenario string) int

// dpCase is one configuration the scenario runs.
type dpCase struct {
	name string
	cfg  Config
	dt   backend.DType
	// tol: 0 wants the same bits as one process; otherwise the largest
	// difference allowed (tensorDiff). The dense gradients of one process
	// sum micro-batch after micro-batch into the same accumulator inside
	// the backward kernels, in another order than a sum over ranks of
	// per-rank sums, so --dense-params host agrees to rounding only.
	// Negative: not compared with one process.
	tol float64
	// like names an earlier case whose rank 0 weights and optimizer state
	// this one's must equal bit for bit (zero's sharded host optimizer
	// against the replicated one).
	like string
}

func dpCases() []dpCase {
	frozen, hostD := testConfig(LSP), testConfig(LSP)
	frozen.DenseParams = DenseFrozen // and fitted projectors (testConfig)
	hostD.DenseParams, hostD.LSP.NoFit = DenseHost, true
	devD := testConfig(LSP)
	devD.LSP.NoFit = true // testConfig's dense parameters: device
	zeroRep := testConfig(Zero)
	zeroRep.replicateHost = true
	loraHost := testConfig(LoRA)
	loraHost.DenseParams = DenseHost
	return []dpCase{{"lsp-frozen-fit-bf16", frozen, backend.BF16, 0, ""}, {"lsp-host-f32", hostD, backend.F32, 2e-5, ""},
		{"lsp-device-f32", devD, backend.F32, 2e-5, ""}, {"native-f32", testConfig(Native), backend.F32, 2e-5, ""},
		{"zero-replicated-f32", zeroRep, backend.F32, 2e-5, ""}, {"zero-f32", testConfig(Zero), backend.F32, 2e-5, "zero-replicated-f32"},
		{"zero-replicated-bf16", zeroRep, backend.BF16, -1, ""}, {"zero-bf16", testConfig(Zero), backend.BF16, -1, "zero-replicated-bf16"},
		{"lora-device-f32", testConfig(LoRA), backend.F32, 2e-5, ""}, {"lora-host-f32", loraHost, backend.F32, 2e-5, ""}}
}

// dpResult is what a run ends with: hashes of the weights and of the
// optimizer state, the steps skipped and the latest loss sum.
type dpResult struct {
	params, state string
	p             []float32
	skipped       int
	loss          float64
	elems         int // CommPerStep().Elems
	sharded       int // CommPerStep().Sharded
}

// dpRun trains dpSteps attempts: the single process (c nil) takes every
// micro-batch of each global batch of size ranks (batches(i, ranks)) with
// --grad-accum ranks; rank r of c takes micro-batch r. nanMicro is the
// micro-batch of the global batch whose loss and gradients are NaN at step
// dpNaNStep. Ranks run pipelined on the CPU backend in its hazard mode
// (random delays, every access checked); the single process sequentially.
func dpRun(c comm.Communicator, tc dpCase, ranks, nanMicro int) (res dpResult, err error) {
	return dpRunOn(cpuRanks, c, tc, ranks, nanMicro)
}

// dpEnv is where a run of dpRunOn trains: open gives rank's backend
// (multi: one of several ranks, else the single process) and the hazards
// it found; dev, when set, joins the ranks' backends in a device
// communicator (Config.DeviceComm), and its close releases it.
type dpEnv struct {
	open func(rank int, multi bool) (backend.Backend, func() []string, error)
	dev  func(be backend.Backend, c comm.Communicator) (DeviceComm, func() error, error)
}

// cpuRanks is the CPU backend: a rank's in its hazard mode.
var cpuRanks = dpEnv{open: func(rank int, multi bool) (backend.Backend, func() []string, error) {
	bc := cpu.Config{Threads: 1}
	if multi {
		bc = hazardConfig(uint64(17 + rank))
		bc.Threads = 1
	}
	be := cpu.New(bc)
	return be, cpuHazards(be), nil
}}

func dpRunOn(env dpEnv, c comm.Communicator, tc dpCase, ranks, nanMicro int) (res dpResult, err error) {
	cfg, accum, rank := tc.cfg, ranks, 0
	if c != nil {
		cfg.Comm, accum, rank = c, 1, c.Rank()
		cfg.Pipelined = true
	}
	spec := ""
	if c == nil {
		spec = fmt.Sprintf("both@%d/%d", dpNaNStep, nanMicro)
	} else if rank == nanMicro {
		spec = fmt.Sprintf("both@%d/0", dpNaNStep)
	}
	if spec != "" {
		disarm, err := faults.ArmNaN(spec)
		if err != nil {
			return res, err
		}
		defer disarm()
	}
	be, hazards, err := env.open(rank, c != nil)
	if err != nil {
		return res, err
	}
	defer be.Close()
	if env.dev != nil && c != nil {
		dev, closeDev, err := env.dev(be, c)
		if err != nil {
			return res, err
		}
		defer func() {
			if cerr := closeDev(); err == nil {
				err = cerr
			}
		}()
		cfg.DeviceComm = dev
	}
	e, err := New(be, small, testB, testT, accum, tc.dt, cfg)
	if err != nil {
		return res, err
	}
	defer func() {
		if ferr := e.Free(); err == nil {
			err = ferr
		}
	}()
	if err := backend.Upload(be, be.DefaultStream(), e.Model.Buffers().Params, gpt2.Init(small, 11)); err != nil {
		return res, err
	}
	if err := e.Init(); err != nil {
		return res, err
	}
	res.elems, res.sharded = e.CommPerStep().Elems, e.CommPerStep().Sharded
	for i := 0; i < dpSteps; i++ {
		global := batches(uint64(i), ranks)
		mine := global
		if c != nil {
			mine = global[rank : rank+1]
		}
		// Every rank checks on the same calibration batches, as
		// lsp-train's are drawn from the seed and the step.
		if e.CheckDue() {
			if _, err := e.Check(batches(1000+uint64(i), e.CalibBatches())); err != nil {
				return res, err
			}
		}
		if res.loss, err = e.Step(mine, 1e-2); err != nil {
			return res, err
		}
		if e.Skipped() {
			res.skipped++
		}
	}
	if hs := hazards(); len(hs) > 0 {
		return res, fmt.Errorf("hazards: %v", hs)
	}
	p, err := backend.Download(be, be.DefaultStream(), e.Model.Buffers().Params)
	if err != nil {
		return res, err
	}
	// A sharded host optimizer's arrays are gathered whole as they are
	// read (every rank takes part); rank 0's are compared.
	res.params, res.p = hashFloats(p), p
	st, err := e.SaveState()
	if err != nil {
		return res, err
	}
	if rank > 0 && cfg.sharded() {
		res.state = "shard"
		return res, nil
	}
	h := sha256.New()
	keys := make([]string, 0, len(st))
	for k := range st {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "%s:%s;", k, hashFloats(st[k]))
	}
	res.state = fmt.Sprintf("%x", h.Sum(nil)[:8])
	return res, nil
}

func hashFloats(v []float32) string {
	h := sha256.New()
	b := make([]byte, 4)
	for _, x := range v {
		binary.LittleEndian.PutUint32(b, math.Float32bits(x))
		h.Write(b)
	}
	return fmt.Sprintf("%x", h.Sum(nil)[:8])
}

// dpRankStart joins the job of a rank's scenario, whose value (of the
// variable env) is the rank whose micro-batch is NaN at dpNaNStep; it
// prints why it cannot.
func dpRankStart(env, scenario string) (c comm.Communicator, nan int, ok bool) {
	c, err := mpi.Init(mpi.Config{})
	if err != nil {
		fmt.Printf("FAIL: %v\n", err)
		return nil, 0, false
	}
	if nan, err = strconv.Atoi(scenario); err != nil {
		fmt.Printf("rank %d: FAIL: %s=%q is not the NaN rank\n", c.Rank(), env, scenario)
		return nil, 0, false
	}
	return c, nan, true
}

// dpRankMain runs every case on this rank and prints one line each.
func dpRankMain(scenario string) int {
	c, nan, ok := dpRankStart(dpScenarioEnv, scenario)
	if !ok {
		return 1
	}
	r := c.Rank()
	for _, tc := range dpCases() {
		before := c.Stats()
		res, err := dpRun(c, tc, c.Size(), nan)
		if err != nil {
			return commtest.Fail(r, "%s: %v", tc.name, err)
		}
		st := c.Stats().Sub(before)
		if r == 0 && tc.tol != 0 {
			b := make([]byte, 4*len(res.p))
			for i, x := range res.p {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
			}
			if err := os.WriteFile(filepath.Join(os.Getenv(dpOutEnv), tc.name), b, 0o644); err != nil {
				return commtest.Fail(r, "%v", err)
			}
		}
		fmt.Printf("rank %d %s: params %s state %s skipped %d loss %x allreduce %d elems %d sent %d sharded %d rs %d\n",
			r, tc.name, res.params, res.state, res.skipped, math.Float64bits(res.loss),
			st.Ops[comm.AllReduce].Calls, res.elems, st.Ops[comm.AllReduce].Sent, res.sharded, st.Ops[comm.ReduceScatter].Sent)
	}
	if err := c.Close(); err != nil {
		return commtest.Fail(r, "Close: %v", err)
	}
	return 0
}

// runSelf runs this test binary under mpirun -np np with env added, for
// at most limit, and returns its output; it fails the test if mpirun
// does (or skips it without mpirun).
func runSelf(t *testing.T, np int, limit time.Duration, env ...string) string {
	t.Helper()
	out, err, _ := mpitest.Run(t, np, limit, env)
	if err != nil {
		t.Fatalf("mpirun -np %d: %v; output:\n%s", np, err, out)
	}
	return out
}

// TestDataParallelMatchesAccum: under mpirun -np 2 and -np 3, lsp mode on
// the CPU backend, every rank's weights and optimizer state after
// dpSteps attempts (one skipped for a NaN on one rank) are bit-identical to
// one process with --grad-accum N over the same global batches.
func TestDataParallelMatchesAccum(t *testing.T) {
	if _, err := exec.LookPath("mpirun"); err != nil {
		t.Skip("SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)")
	}
	for _, np := range []int{2, 3} {
		nan := np - 1 // the last rank's micro-batch is NaN at dpNaNStep
		want := map[string]dpResult{}
		for _, tc := range dpCases() {
			if tc.tol < 0 {
				continue
			}
			res, err := dpRun(nil, tc, np, nan)
			if err != nil {
				t.Fatalf("%s, one process, --grad-accum %d: %v", tc.name, np, err)
			}
			if res.skipped != 1 {
				t.Fatalf("%s, one process: %d steps skipped, want 1", tc.name, res.skipped)
			}
			want[tc.name] = res
		}
		dir := t.TempDir()
		start := time.Now()
		out := runSelf(t, np, 2*time.Minute, dpScenarioEnv+"="+strconv.Itoa(nan), dpOutEnv+"="+dir)
		for _, tc := range dpCases() {
			// The bytes on the link: every attempt all-reduces
			// CommPerStep().Elems elements, and an all-reduce of n sends
			// 2 (np-1) n elements over all ranks.
			re := regexp.MustCompile(fmt.Sprintf(`(?m)^rank \d+ %s: .* elems (\d+) sent (\d+) sharded (\d+) rs (\d+)$`, regexp.QuoteMeta(tc.name)))
			var sent, rs int64
			elems, sharded := -1, 0
			for _, m := range re.FindAllStringSubmatch(out, -1) {
				e, _ := strconv.Atoi(m[1])
				s, _ := strconv.ParseInt(m[2], 10, 64)
				sharded, _ = strconv.Atoi(m[3])
				r, _ := strconv.ParseInt(m[4], 10, 64)
				if elems >= 0 && e != elems {
					t.Errorf("mpirun -np %d, %s: ranks count %d and %d elements per step", np, tc.name, elems, e)
				}
				elems, sent, rs = e, sent+s, rs+r
			}
			// A reduce-scatter of n elements sends (np-1) n of them
			// over all ranks.
			if want := int64(dpSteps) * int64(sharded) * int64(np-1) * 4; rs != want {
				t.Errorf("mpirun -np %d, %s: the ranks sent %d bytes in reduce-scatters; %d attempts of %d elements make %d",
					np, tc.name, rs, dpSteps, sharded, want)
			}
			if want := int64(dpSteps) * int64(elems) * 2 * int64(np-1) * 4; elems <= 0 || sent != want {
				t.Errorf("mpirun -np %d, %s: the ranks sent %d bytes in all-reduces; %d attempts of %d elements make %d",
					np, tc.name, sent, dpSteps, elems, want)
			}
			t.Logf("mpirun -np %d, %s: %d elements all-reduced per step, %d bytes sent over all ranks per step", np, tc.name, elems, sent/dpSteps)
			w := want[tc.name]
			for r := 0; r < np; r++ {
				re := regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d %s: params (\w+) state (\w+) skipped (\d+) loss (\w+)`, r, regexp.QuoteMeta(tc.name)))
				m := re.FindStringSubmatch(out)
				if m == nil {
					t.Fatalf("mpirun -np %d: no result of rank %d for %s; output:\n%s", np, r, tc.name, out)
				}
				if m[3] != "1" {
					t.Errorf("mpirun -np %d, %s, rank %d: %s steps skipped, want 1", np, tc.name, r, m[3])
				}
				if r > 0 {
					m0 := regexp.MustCompile(fmt.Sprintf(`(?m)^rank 0 %s: params (\w+) state (\w+)`, regexp.QuoteMeta(tc.name))).FindStringSubmatch(out)
					if m0 == nil || m0[1] != m[1] || (m0[2] != m[2] && m[2] != "shard") {
						t.Errorf("mpirun -np %d, %s: rank %d's weights or state differ from rank 0's", np, tc.name, r)
					}
				}
				if r == 0 && tc.like != "" {
					ml := regexp.MustCompile(fmt.Sprintf(`(?m)^rank 0 %s: params (\w+) state (\w+)`, regexp.QuoteMeta(tc.like))).FindStringSubmatch(out)
					if ml == nil || ml[1] != m[1] || ml[2] != m[2] {
						t.Errorf("mpirun -np %d, %s: rank 0's weights and gathered state %v differ from %s's %v", np, tc.name, m[1:3], tc.like, ml)
					}
				}
				if tc.tol != 0 {
					continue
				}
				if m[1] != w.params || m[2] != w.state {
					t.Errorf("mpirun -np %d, %s, rank %d: params %s state %s skipped %s; one process with --grad-accum %d: params %s state %s skipped %d",
						np, tc.name, r, m[1], m[2], m[3], np, w.params, w.state, w.skipped)
				}
				bits, _ := strconv.ParseUint(m[4], 16, 64)
				if l := math.Float64frombits(bits); math.Abs(l-w.loss) > max(1e-9, tc.tol)*math.Abs(w.loss) {
					t.Errorf("mpirun -np %d, %s, rank %d: latest loss sum %v, one process %v", np, tc.name, r, l, w.loss)
				}
			}
		}
		for _, tc := range dpCases() {
			if tc.tol <= 0 {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, tc.name))
			if err != nil {
				t.Fatal(err)
			}
			got := make([]float32, len(b)/4)
			for i := range got {
				got[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			}
			if len(got) != len(want[tc.name].p) {
				t.Fatalf("%s: rank 0 wrote %d weights, want %d", tc.name, len(got), len(want[tc.name].p))
			}
			worst := tensorDiff(small, got, want[tc.name].p)
			t.Logf("mpirun -np %d, %s: worst difference from one process %.3g of the tensor's scale", np, tc.name, worst)
			if worst > tc.tol {
				t.Errorf("mpirun -np %d, %s: worst difference from one process %.3g of the tensor's scale, want <= %g", np, tc.name, worst, tc.tol)
			}
		}
		t.Logf("mpirun -np %d: %v\n%s", np, time.Since(start).Round(time.Millisecond), out)
	}
}
