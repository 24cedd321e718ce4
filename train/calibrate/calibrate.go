// The machine description, Measure, and the timing loop every item uses.

package calibrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// CPU is the CPU backend as a machine, at one thread count. Rates are per
// second; FLOP/s count a multiply-add as two.
type CPU struct {
	Threads int    `json:"threads"`
	SIMD    string `json:"simd"` // the GEMM and Adam kernels' path
	// Gemm holds the exact shapes measured; GemmSquares the square NN
	// shapes GemmRate falls back to for others.
	Gemm        []GemmSample `json:"gemm"`
	GemmSquares []GemmSample `json:"gemm_squares"`
	// GemmPeak is the highest GEMM rate measured: the reference rate of
	// the FLOP-bound op families.
	GemmPeak float64 `json:"gemm_peak_flops"`
	Memory   Memory  `json:"memory"`
	// Ops are the other compute ops, by Backend method name and size.
	Ops      []OpSample `json:"ops"`
	Overhead Overhead   `json:"overhead"`
	Link     Link       `json:"link"`
	HostAdam HostAdam   `json:"host_adam"`
	// Sharing pairs the compute stream's GEMM, the host Adam and a link
	// copy on another stream.
	Sharing []Sharing `json:"sharing"`
	// Seconds is how long Measure took.
	Seconds float64 `json:"measure_seconds"`
}

// GemmShape is one Gemm call's layout and sizes: C[M,N] = op(A) op(B),
// op(A) M x K, op(B) K x N. In JSON it is its String, "NT 1024x50257x768"
// (layout of A then B, N plain or T transposed; then M x N x K).
type GemmShape struct {
	TransA, TransB bool
	M, N, K        int
}

// FLOPs is 2*M*N*K.
func (s GemmShape) FLOPs() float64 { return 2 * float64(s.M) * float64(s.N) * float64(s.K) }

// Intensity is 1/(1/M + 1/N + 1/K): proportional to the FLOPs per element
// of the three matrices, the size class GemmRate falls back on (n/3 for a
// square n x n x n).
func (s GemmShape) Intensity() float64 {
	return 1 / (1/float64(s.M) + 1/float64(s.N) + 1/float64(s.K))
}

func (s GemmShape) String() string {
	l := [2]string{"N", "T"}
	return fmt.Sprintf("%s%s %dx%dx%d", l[b2i(s.TransA)], l[b2i(s.TransB)], s.M, s.N, s.K)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// MarshalText writes String.
func (s GemmShape) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText writes.
func (s *GemmShape) UnmarshalText(b []byte) error {
	var l string
	var x GemmShape
	if _, err := fmt.Sscanf(string(b), "%2s %dx%dx%d", &l, &x.M, &x.N, &x.K); err != nil || len(l) != 2 {
		return fmt.Errorf("calibrate: gemm shape %q: want like \"NT 1024x50257x768\"", b)
	}
	for i, p := range []*bool{&x.TransA, &x.TransB} {
		switch l[i] {
		case 'N':
		case 'T':
			*p = true
		default:
			return fmt.Errorf("calibrate: gemm shape %q: layout %q, want N or T twice", b, l)
		}
	}
	*s = x
	return nil
}

// GemmSample is one measured shape.
type GemmSample struct {
	Shape   GemmShape `json:"shape"`
	Seconds float64   `json:"seconds"` // median per call, enqueue included
	Best    float64   `json:"best"`    // the fastest repetition's
	Rate    float64   `json:"flops"`   // FLOPs()/Seconds
}

// Memory is bandwidth in bytes/s.
type Memory struct {
	// Triad is STREAM's a = b + s*c on a host worker pool of the thread
	// count, 12 bytes per element, the higher of plain and non-temporal
	// stores: the yardstick of every memory-bound efficiency.
	Triad         float64 `json:"triad"`
	TriadPlain    float64 `json:"triad_plain"`
	TriadElements int     `json:"triad_elements"`
	// RMW is the backend's Accumulate (dst += src, 12 bytes per element),
	// Copy its CopyD2D (8 bytes per element), on arrays of TriadElements.
	RMW  float64 `json:"rmw"`
	Copy float64 `json:"copy"`
}

// OpSample is one op family at one size.
type OpSample struct {
	Method  string  `json:"method"` // the Backend method
	Dims    string  `json:"dims"`   // its sizes, for people
	FLOPs   float64 `json:"flops"`
	Bytes   float64 `json:"bytes"`
	Seconds float64 `json:"seconds"` // median per op, enqueue included
	Best    float64 `json:"best"`    // the fastest repetition's
	Basis   string  `json:"basis"`   // "bytes" (vs Memory.Triad) or "flops" (vs GemmPeak)
	Eff     float64 `json:"eff"`     // ideal / (Seconds - Overhead.Op)
	// Rate is FLOPs/Seconds for the flops basis, Bytes/Seconds otherwise.
	Rate float64 `json:"rate"`
}

// Overhead is fixed costs in seconds.
type Overhead struct {
	// Op is the cost one op adds to its stream: a Fill of one element,
	// enqueued in a batch, per op.
	Op float64 `json:"op"`
	// RoundTrip is one such op enqueued alone and synchronized.
	RoundTrip float64 `json:"round_trip"`
	// RecordWait is an event recorded on one stream and waited on by
	// another, per pair, in a batch.
	RecordWait float64 `json:"record_wait"`
	// Synchronize is Synchronize of an idle stream.
	Synchronize float64 `json:"synchronize"`
}

// Link is the backend's CopyH2D and CopyD2H: time = Latency + bytes/bandwidth.
type Link struct {
	H2D        float64 `json:"h2d_bytes_per_s"`
	D2H        float64 `json:"d2h_bytes_per_s"`
	H2DLatency float64 `json:"h2d_latency"` // seconds, a 4-byte copy
	D2HLatency float64 `json:"d2h_latency"`
	Bytes      int     `json:"bytes"` // size of the bandwidth copies
}

// HostAdam is the fused host AdamW (host.Workers.AdamStep, fp32 gradient
// pre-scanned, no bf16 copy: zero mode with an fp32 model) on a worker
// pool of the thread count.
type HostAdam struct {
	Params        int     `json:"params"`          // parameters per step measured
	BytesPerParam int     `json:"bytes_per_param"` // host.AdamBytesPerElement
	Rate          float64 `json:"params_per_s"`    // alone
	Eff           float64 `json:"eff"`             // Rate*BytesPerParam / Memory.Triad
	// Overhead is one step of a 64-element tensor: the fixed cost of a
	// host Adam call (waking the pool, splitting the work), s.
	Overhead float64 `json:"overhead"`
}

// Sharing is two loops of work run at the same time on the cores they
// share (the backend's ops and the host Adam workers use the same cores;
// the backend's streams are goroutines), each loop's rate alone and
// shared. Rates are in the loop's own unit: a GEMM in FLOP/s, the host
// Adam in parameters/s, a copy in bytes/s.
type Sharing struct {
	A       string  `json:"a"`
	B       string  `json:"b"`
	AAlone  float64 `json:"a_alone"`
	AShared float64 `json:"a_shared"`
	BAlone  float64 `json:"b_alone"`
	BShared float64 `json:"b_shared"`
	Seconds float64 `json:"window_seconds"` // each loop's length
}

// Options are what to measure.
type Options struct {
	// Threads is the backend's compute threads and the host pool's
	// workers (0: runtime.NumCPU()).
	Threads int
	// Gemms are the exact shapes to time (duplicates are timed once).
	Gemms []GemmShape
	// Ops are the geometries at which to time the other ops (none: only
	// GEMM, memory, overhead, link and host Adam).
	Ops []OpSize
	// Budget is the time to aim for in all (0: 30 s): each item gets a
	// share, and at least a warm-up and two or three timed repetitions,
	// so large shapes may take longer.
	Budget time.Duration
	// Squares are the sizes of the fallback GEMMs (nil: 32 to 1024).
	Squares []int
	// TriadElements per array (0: host.TriadMinElements(), four times the
	// last-level cache); AdamParams per Adam step (0: 8M).
	TriadElements int
	AdamParams    int
	// Window is each sharing loop's length (0: half a second).
	Window time.Duration
	// Rounds, when positive, is the number of repetitions of every cold
	// timing (GEMM shapes, squares and ops, timed in turns: one round
	// times each of them once) instead of what the budget allows.
	// Between, when set, is called after each round: a caller interleaves
	// its own measurements with the calibration there, so that both span
	// the same stretch of a machine whose speed drifts (bench/plan steps
	// the engines it predicts).
	Rounds  int
	Between func() error
}

// DefaultSquares are the fallback GEMM sizes.
var DefaultSquares = []int{32, 64, 128, 256, 512, 1024}

// Measure times everything Options ask for and returns the description.
// It stops early with ctx's error when ctx is done.
func Measure(ctx context.Context, o Options) (CPU, error) {
	start := time.Now()
	if o.Threads <= 0 {
		o.Threads = runtime.NumCPU()
	}
	if o.Budget <= 0 {
		o.Budget = 30 * time.Second
	}
	if o.Squares == nil {
		o.Squares = DefaultSquares
	}
	if o.TriadElements <= 0 {
		o.TriadElements = host.TriadMinElements()
	}
	if o.AdamParams <= 0 {
		o.AdamParams = 8 << 20
	}
	if o.Window <= 0 {
		o.Window = time.Second / 2
	}
	for _, s := range o.Gemms {
		if s.M < 1 || s.N < 1 || s.K < 1 {
			return CPU{}, fmt.Errorf("calibrate: gemm shape %v: sizes must be positive", s)
		}
	}
	for _, g := range o.Ops {
		if err := g.validate(); err != nil {
			return CPU{}, fmt.Errorf("calibrate: op size %+v: %w", g, err)
		}
	}
	be := cpu.New(cpu.Config{Threads: o.Threads})
	defer be.Close()
	m := &meter{ctx: ctx, be: be, s: be.DefaultStream(), rounds: o.Rounds}
	// Shares of the budget: one per GEMM shape and square, one per op
	// sample (about 30 per geometry), and a few for the rest.
	items := len(o.Gemms) + len(o.Squares) + 30*len(o.Ops) + 10
	m.share = o.Budget / time.Duration(items)

	c := CPU{Threads: o.Threads, SIMD: host.ActiveSIMD().String()}
	var err error
	if c.Overhead, err = m.overhead(); err != nil {
		return CPU{}, fmt.Errorf("calibrate: overhead: %w", err)
	}
	// Memory and the link first: they time large copies warm (perOp);
	// GEMMs and the other ops are timed cold (coldTiming).
	if c.Memory, err = m.memory(o.Threads, o.TriadElements); err != nil {
		return CPU{}, fmt.Errorf("calibrate: memory: %w", err)
	}
	if c.Link, err = m.link(); err != nil {
		return CPU{}, fmt.Errorf("calibrate: link: %w", err)
	}
	if err := m.coldOps(&c, o); err != nil {
		return CPU{}, err
	}
	c.finishOps()
	if c.HostAdam, err = m.hostAdam(o, c); err != nil {
		return CPU{}, fmt.Errorf("calibrate: host adam: %w", err)
	}
	if c.Sharing, err = m.sharing(o, c); err != nil {
		return CPU{}, fmt.Errorf("calibrate: sharing: %w", err)
	}
	c.Seconds = time.Since(start).Seconds()
	return c, nil
}

// coldOps times the GEMMs at their shapes, the squares and the other ops
// at their geometries, cold (coldTiming), into c: all of them in turns
// (timeOps), with o.Between called between rounds, except GEMMs whose
// operands would take the set past gemmTurnBytes, which are timed one
// after the other first.
func (m *meter) coldOps(c *CPU, o Options) (err error) {
	off, err := m.coldTiming(c.Overhead.Op)
	if err != nil {
		return fmt.Errorf("calibrate: cache flush: %w", err)
	}
	defer off()
	defer m.release()
	shapes := dedupe(o.Gemms)
	var sq []GemmShape
	for _, n := range o.Squares {
		sq = append(sq, GemmShape{M: n, N: n, K: n})
	}
	all := append(slices.Clone(shapes), sq...)
	var turns []GemmShape
	var total int64
	alone := map[GemmShape]GemmSample{}
	for _, s := range all {
		if b := s.operandBytes(); total+b <= gemmTurnBytes {
			total += b
			turns = append(turns, s)
			continue
		}
		sec, best, err := m.gemm(s)
		if err != nil {
			return fmt.Errorf("calibrate: gemm %v: %w", s, err)
		}
		alone[s] = GemmSample{Shape: s, Seconds: sec, Best: best, Rate: s.FLOPs() / sec}
	}
	gemmRuns, gemmDone, err := m.gemmRuns(turns)
	if err != nil {
		return fmt.Errorf("calibrate: gemm: %w", err)
	}
	runs := slices.Clone(gemmRuns)
	var cases []opCase
	for _, g := range o.Ops {
		cs, err := m.opCases(g.withDefaults())
		if err != nil {
			return fmt.Errorf("calibrate: ops at %+v: %w", g, err)
		}
		cases = append(cases, cs...)
	}
	for _, cs := range cases {
		runs = append(runs, cs.run)
	}
	m.between = o.Between
	secs, bests, err := m.timeOps(runs)
	m.between = nil
	if err != nil {
		return fmt.Errorf("calibrate: gemms and ops: %w", err)
	}
	n := len(gemmRuns)
	timed, err := gemmDone(secs[:n], bests[:n])
	if err != nil {
		return fmt.Errorf("calibrate: gemm: %w", err)
	}
	for _, g := range timed {
		alone[g.Shape] = g
	}
	for _, s := range shapes {
		c.Gemm = append(c.Gemm, alone[s])
	}
	for _, s := range sq {
		c.GemmSquares = append(c.GemmSquares, alone[s])
	}
	for _, g := range append(slices.Clone(c.Gemm), c.GemmSquares...) {
		c.GemmPeak = max(c.GemmPeak, g.Rate)
	}
	for i, cs := range cases {
		sec, best := secs[n+i], bests[n+i]
		if err := positive(sec); err != nil {
			return fmt.Errorf("calibrate: %s %s: %w", cs.method, cs.dims, err)
		}
		c.Ops = append(c.Ops, OpSample{Method: cs.method, Dims: cs.dims, FLOPs: cs.flops, Bytes: AccessBytes(cs.acc), Seconds: sec, Best: best})
	}
	return nil
}

// ReadFile reads a description that bench/calibrate wrote (-o).
func ReadFile(path string) (CPU, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return CPU{}, fmt.Errorf("calibrate: %w", err)
	}
	var c CPU
	if err := json.Unmarshal(b, &c); err != nil {
		return CPU{}, fmt.Errorf("calibrate: %s: %w", path, err)
	}
	if c.Threads < 1 || c.GemmPeak <= 0 || c.Memory.Triad <= 0 {
		return CPU{}, fmt.Errorf("calibrate: %s: no threads, GEMM peak or triad bandwidth: not a machine description", path)
	}
	return c, nil
}

func dedupe(s []GemmShape) []GemmShape {
	var out []GemmShape
	for _, x := range s {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// meter times work on one backend.
type meter struct {
	ctx   context.Context
	be    *cpu.Backend
	s     backend.Stream
	share time.Duration // the budget of one item
	bufs  []backend.Tensor
	// between and rounds are Options.Between and Options.Rounds, for the
	// cold timings' turns (timeOps).
	between func() error
	rounds  int

	// cold, when set (coldTiming), times each op alone by a pair of
	// events after a sweep through the flush buffers, instead of in
	// warm back-to-back batches.
	cold       *flush
	opOverhead float64 // Overhead.Op, added to cold times (see coldTiming)
	e0, e1     backend.Event
}

// flush is a buffer twice the size of the last-level cache and what
// SumSquares needs to read it: reading it evicts an op's operands from
// every cache level before the op is timed. Reading, not copying: a copy
// would leave the caches full of dirty lines, whose write-back the timed
// op would then pay for.
type flush struct {
	buf, sum, work backend.Tensor
	sec            float64 // one sweep's time, for the repetition count
}

// sweep enqueues the read of the flush buffer.
func (f *flush) sweep(m *meter) error { return m.be.SumSquares(m.s, f.sum, f.buf, f.work) }

// alloc allocates n elements of dt and fills them with v, so that every
// page is touched before anything is timed.
func (m *meter) alloc(name string, n int, dt backend.DType, v float32) (backend.Tensor, error) {
	t, err := m.be.Alloc(name, max(n, 1), dt)
	if err != nil {
		return t, err
	}
	m.bufs = append(m.bufs, t)
	if dt == backend.F32 || dt == backend.BF16 {
		if err := m.be.Fill(m.s, t, v); err != nil {
			return t, err
		}
	}
	return t, nil
}

// release frees what alloc allocated.
func (m *meter) release() {
	if err := m.be.Synchronize(m.s); err != nil {
		return // the next measurement reports the sticky error
	}
	for _, t := range m.bufs {
		m.be.Free(t)
	}
	m.bufs = nil
}

// timing is the cap on batch and repetition counts.
const (
	minBatch = 2 * time.Millisecond // a batch of ops at least this long
	maxBatch = 1000
	maxReps  = 15
)

// perOp returns the median seconds of one enqueue of op, which is timed in
// batches (enqueued back to back, then one Synchronize) after a warm-up
// batch of one. Items slower than a quarter second get two timed
// repetitions, others at least three, more while the item's share of the
// budget lasts.
func (m *meter) perOp(op func() error) (float64, error) {
	med, _, err := m.timeOp(op)
	return med, err
}

// timeOp is perOp that also returns the fastest repetition's time.
func (m *meter) timeOp(op func() error) (med, best float64, err error) {
	batch := func(k int) (float64, error) { return m.batch(op, k) }
	if err := m.ctx.Err(); err != nil {
		return 0, 0, err
	}
	if err := m.be.Synchronize(m.s); err != nil { // set-up ops out of the timing
		return 0, 0, err
	}
	first, err := batch(1)
	if err != nil {
		return 0, 0, err
	}
	k, reps := m.repetitions(first)
	ts := make([]float64, reps)
	for i := range ts {
		if ts[i], err = batch(k); err != nil {
			return 0, 0, err
		}
		if err := m.ctx.Err(); err != nil {
			return 0, 0, err
		}
	}
	return median(ts), slices.Min(ts), nil
}

// timeOps is timeOp for several ops at once, their repetitions taken in
// turns (a batch of the first op, a batch of the second, ..., then again)
// so that each op's median spans the whole time they take together: on a
// machine whose speed drifts for seconds at a time (other virtual machines
// on the host), one op timed in one stretch may fall entirely within a
// slow spell that the others, and the step being predicted, miss.
func (m *meter) timeOps(ops []func() error) (med, best []float64, err error) {
	if err := m.be.Synchronize(m.s); err != nil { // set-up ops out of the timing
		return nil, nil, err
	}
	n := len(ops)
	ks, reps := make([]int, n), make([]int, n)
	ts := make([][]float64, n)
	for i, op := range ops {
		first, err := m.batch(op, 1) // the warm-up
		if err != nil {
			return nil, nil, err
		}
		ks[i], reps[i] = m.repetitions(first)
		if m.rounds > 0 {
			reps[i] = m.rounds
		}
	}
	for r := range slices.Max(append(reps, 0)) {
		for i, op := range ops {
			if r >= reps[i] {
				continue
			}
			t, err := m.batch(op, ks[i])
			if err != nil {
				return nil, nil, err
			}
			ts[i] = append(ts[i], t)
		}
		if m.between != nil {
			if err := m.between(); err != nil {
				return nil, nil, err
			}
		}
		if err := m.ctx.Err(); err != nil {
			return nil, nil, err
		}
	}
	med, best = make([]float64, n), make([]float64, n)
	for i := range ops {
		med[i], best[i] = median(ts[i]), slices.Min(ts[i])
	}
	return med, best, nil
}

// repetitions is the batch size and the number of timed batches of an
// op whose warm-up took first seconds: batches of at least minBatch
// (cold timing: batches of one, each op timed by events), at least three
// repetitions (two for ops slower than a quarter second), more while the
// item's share of the budget lasts.
func (m *meter) repetitions(first float64) (k, reps int) {
	k, each := min(maxBatch, max(1, int(math.Ceil(minBatch.Seconds()/max(first, 1e-9))))), first
	if m.cold != nil {
		k, each = 1, first+m.cold.sec
	}
	reps = 3
	if first > 0.25 {
		reps = 2
	}
	return k, min(maxReps, max(reps, int(m.share.Seconds()/(float64(k)*max(each, 1e-9)))))
}

// batch runs op once untimed, then enqueues it k times back to back,
// synchronizes and returns the seconds per op. The untimed run brings the
// op's operands into the caches: without it an op slower than minBatch
// (k = 1) would be timed cold after whatever ran before it, and faster
// ones warm. With cold timing on, it is coldBatch instead.
func (m *meter) batch(op func() error, k int) (float64, error) {
	if m.cold != nil {
		return m.coldBatch(op, k)
	}
	if err := op(); err != nil {
		return 0, err
	}
	if err := m.be.Synchronize(m.s); err != nil {
		return 0, err
	}
	t0 := time.Now()
	for range k {
		if err := op(); err != nil {
			return 0, err
		}
	}
	if err := m.be.Synchronize(m.s); err != nil {
		return 0, err
	}
	return time.Since(t0).Seconds() / float64(k), nil
}

// coldTiming turns cold timing on until the returned function turns it
// off and frees the flush buffers: each op is then timed alone, by a pair
// of events around it on its stream, right after a read of a buffer
// twice the size of the last-level cache, so that its operands and
// outputs come from memory. That is the state a training step's ops find
// theirs in: between two uses of a weight or an activation run the rest
// of the layer's ops, or a whole step, and the caches (shared with other
// tenants on a virtual machine) do not keep them; timed warm, back to
// back on the same operands, the ops of the small models ran 10 to 30%
// faster than the same ops in their steps (timed by trace.WrapTimed).
// Cold times get Overhead.Op added, the cost of enqueueing the op that
// the events do not see, so that Seconds keeps meaning what a stream of
// such ops spends per op.
func (m *meter) coldTiming(opOverhead float64) (func(), error) {
	llc := int(host.TriadLLCBytes())
	if llc <= 0 {
		llc = 32 << 20
	}
	f := &flush{}
	var err error
	if f.buf, err = m.be.Alloc("flush", 2*llc/4, backend.F32); err == nil {
		if f.sum, err = m.be.Alloc("flush sum", 1, backend.F32); err == nil {
			f.work, err = m.be.Alloc("flush work", backend.SumSquaresWork, backend.F64)
		}
	}
	if err == nil {
		if m.e0, err = m.be.NewEvent("calibrate-start"); err == nil {
			m.e1, err = m.be.NewEvent("calibrate-end")
		}
	}
	off := func() {
		m.cold = nil
		if m.be.Synchronize(m.s) == nil {
			for _, t := range []backend.Tensor{f.buf, f.sum, f.work} {
				if t.Shape != nil {
					m.be.Free(t)
				}
			}
		}
		for _, e := range []backend.Event{m.e0, m.e1} {
			if e != nil {
				m.be.DestroyEvent(e)
			}
		}
		m.e0, m.e1 = nil, nil
	}
	if err != nil {
		off()
		return nil, err
	}
	if err := m.be.Fill(m.s, f.buf, 0.5); err != nil { // touch every page
		off()
		return nil, err
	}
	if f.sec, err = m.perOp(func() error { return f.sweep(m) }); err != nil {
		off()
		return nil, err
	}
	m.cold, m.opOverhead = f, opOverhead
	return off, nil
}

// coldBatch times op k times, each alone after a sweep (coldTiming), and
// returns the mean seconds per op, Overhead.Op included.
func (m *meter) coldBatch(op func() error, k int) (float64, error) {
	total := 0.0
	for range k {
		if err := m.cold.sweep(m); err != nil {
			return 0, err
		}
		if err := m.be.Record(m.e0, m.s); err != nil {
			return 0, err
		}
		if err := op(); err != nil {
			return 0, err
		}
		if err := m.be.Record(m.e1, m.s); err != nil {
			return 0, err
		}
		if err := m.be.Synchronize(m.s); err != nil {
			return 0, err
		}
		d, err := m.be.ElapsedTime(m.e0, m.e1)
		if err != nil {
			return 0, err
		}
		total += d.Seconds()
	}
	return total/float64(k) + m.opOverhead, nil
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

var errNoTime = errors.New("calibrate: measured time is not positive")

func positive(sec float64) error {
	if !(sec > 0) || math.IsInf(sec, 0) {
		return errNoTime
	}
	return nil
}
