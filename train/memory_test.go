package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// resolveModel is the model ResolveModel finds for name.
func resolveModel(t *testing.T, name string) model.Spec {
	t.Helper()
	mc, _, err := ResolveModel(name)
	if err != nil {
		t.Fatal(err)
	}
	return mc
}

// memoryPlan is the memory plan of a run of c and its model.
func memoryPlan(t *testing.T, c Config) (model.Spec, Memory) {
	t.Helper()
	mc := resolveModel(t, c.Model)
	p, err := MemoryOf(mc, c)
	if err != nil {
		t.Fatal(err)
	}
	return mc, p
}

const hostMemChildEnv = "LSP_TRAIN_HOSTMEM_CHILD"

// hostMemResult is what the child of TestHostPlanMeasured reports.
type hostMemResult struct {
	IdleRSS, PeakRSS int64 // bytes: VmRSS before the run, the most VmHWM over it
	Plan             int64 // the plan's HostPeak
	Detail           string
	// Phases are the transient phases the run went through, by the name
	// of their Transient part.
	Phases map[string]phaseResult
}

// phaseResult is one transient phase: the most its resident memory rose
// above what it leaves resident (VmHWM at its end less VmRSS once its
// garbage is given back, the garbage before it given back at its start),
// the plan's bytes for it, and the bound the issue set: the model's
// largest tensor as fp32 plus the staging buffer.
type phaseResult struct {
	Grew, Planned, Bound int64
}

// hostMemRun is one child of TestHostPlanMeasured: a model and mode run
// from a preset, resumed in the same --out, or started from the Hugging
// Face export of the run before it (load).
type hostMemRun struct {
	Name, Model string
	Mode        engine.Mode
	Resume      bool
	Load        string // the run whose export --model names
}

// TestHostPlanMeasured runs a few steps on the CPU backend in a child
// process per run, and checks the host plan against what the child
// really held. The whole run: its peak resident memory (VmHWM) minus its
// resident memory before the run, within 10% of HostPeak (the CPU
// backend's device memory, the run's own buffers, the largest of the
// transients). Each transient phase (the initial weights or their load,
// a checkpoint's write and restore, the export), measured from its own
// start: its growth at most the model's largest tensor plus the staging
// buffer, and within 10% of its Transient part, or where that part is
// below the Go heap's headroom (a phase of chunk buffers: the garbage the
// run lets build up between collections is that large) at most the part
// plus the headroom. gpt2-medium (355M parameters; 1.4 GB as fp32,
// its largest tensor 206 MB) is where a phase that held the whole model
// (as each did once) would exceed the bound by 7x; gpt2 in native mode
// covers the device optimizer's state.
func TestHostPlanMeasured(t *testing.T) {
	if run := os.Getenv(hostMemChildEnv); run != "" {
		var r hostMemRun
		if err := json.Unmarshal([]byte(run), &r); err != nil {
			t.Fatal(err)
		}
		hostMemChild(t, r)
		return
	}
	if testing.Short() || raceEnabled {
		t.Skip("trains gpt2 and gpt2-medium (2 GB and more resident); runs in the race-free pass (make gotest-norace)")
	}
	if _, err := os.Stat("/proc/self/clear_refs"); err != nil {
		t.Skip("no /proc/self/clear_refs here")
	}
	dir := t.TempDir()
	for _, run := range []hostMemRun{
		{Name: "native", Model: "gpt2", Mode: engine.Native},
		{Name: "lsp", Model: "gpt2-medium", Mode: engine.LSP},
		{Name: "lsp+resume", Model: "gpt2-medium", Mode: engine.LSP, Resume: true},
		{Name: "lsp+load", Model: "gpt2-medium", Mode: engine.LSP, Load: "lsp"},
	} {
		t.Run(run.Name, func(t *testing.T) {
			raw, err := json.Marshal(run)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestHostPlanMeasured$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), hostMemChildEnv+"="+string(raw), "LSP_TEST_DIR="+dir)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			var res hostMemResult
			found := false
			for _, line := range strings.Split(string(out), "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "hostmem-result: "); ok {
					if err := json.Unmarshal([]byte(v), &res); err != nil {
						t.Fatalf("child's result %q: %v", v, err)
					}
					found = true
				}
			}
			if !found {
				t.Fatalf("child reported no result:\n%s", out)
			}
			used := res.PeakRSS - res.IdleRSS
			ratio := float64(res.Plan) / float64(used)
			t.Logf("%s: plan %d bytes, peak RSS %d - idle %d = %d bytes (plan/measured %.3f)\nplan: %s",
				run.Name, res.Plan, res.PeakRSS, res.IdleRSS, used, ratio, res.Detail)
			if ratio < 0.9 || ratio > 1.1 {
				t.Errorf("%s: host plan %d bytes, measured %d bytes above the idle process: %.3fx, want within 10%%\nplan: %s",
					run.Name, res.Plan, used, ratio, res.Detail)
			}
			for _, name := range slices.Sorted(maps.Keys(res.Phases)) {
				ph := res.Phases[name]
				t.Logf("%s: phase %s grew %.1f MiB, planned %.1f MiB, bound %.1f MiB", run.Name, name,
					mib(ph.Grew), mib(ph.Planned), mib(ph.Bound))
				if ph.Grew > ph.Bound {
					t.Errorf("%s: phase %s grew %d bytes, more than the largest tensor and the staging buffer, %d", run.Name, name, ph.Grew, ph.Bound)
				}
				// The run lets up to goHeapHeadroom of garbage build up
				// between collections (boundGarbage), a part the plan
				// holds throughout; a phase's chunk buffers fill it, so a
				// phase planned below it is checked against its plan
				// plus the headroom, one planned above it within 10%.
				if r := float64(ph.Grew) / float64(ph.Planned); ph.Planned >= goHeapHeadroom && (r < 0.9 || r > 1.1) {
					t.Errorf("%s: phase %s grew %d bytes, the plan says %d: %.3fx, want within 10%%", run.Name, name, ph.Grew, ph.Planned, r)
				} else if ph.Grew > ph.Planned+goHeapHeadroom {
					t.Errorf("%s: phase %s grew %d bytes, more than its plan (%d) and the Go heap's headroom (%d)", run.Name, name, ph.Grew, ph.Planned, goHeapHeadroom)
				}
			}
			if len(res.Phases) < 3 {
				t.Errorf("%s: the child saw the phases %v, want the weights, a checkpoint write and the export at least", run.Name, slices.Sorted(maps.Keys(res.Phases)))
			}
		})
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// hostMemChild is the child's side: note the resident memory, run (or
// resume, or load the export of, the run before it), measuring each
// transient phase from its start, and report the peaks beside the plan.
func hostMemChild(t *testing.T, r hostMemRun) {
	dir := os.Getenv("LSP_TEST_DIR")
	idle := procStatus(t, "VmRSS")
	c := Defaults()
	c.Model, c.Data, c.Batch, c.SeqLen, c.Steps = r.Model, "builtin:sort:200", 2, 32, 1
	c.EvalFraction, c.EvalEvery, c.CheckpointEvery, c.Warmup = 0, 0, 0, 0
	c.Mode, c.Out = r.Mode, filepath.Join(dir, r.Name)
	if r.Mode == engine.LSP {
		c.D, c.R = 64, 2 // small state: the phases measure the model's tensors
	}
	if r.Resume {
		c.Out = filepath.Join(dir, strings.TrimSuffix(r.Name, "+resume"))
		c.Steps, c.Resume = 2, true
	}
	if r.Load != "" {
		c.Model = filepath.Join(dir, r.Load, "hf")
	}
	mc := resolveModel(t, c.Model)
	largest := 0
	for _, p := range mc.Layout() {
		largest = max(largest, p.Len())
	}
	bound := 4*int64(largest) + backend.StagingBytes
	peak := int64(0)
	phases := map[string]phaseResult{}
	var start int64
	phaseHook = func(name string, begin bool) {
		if begin {
			peak = max(peak, procStatus(t, "VmHWM"))
			debug.FreeOSMemory() // the garbage before the phase is not the phase's
			if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
				t.Fatalf("resetting the peak resident memory: %v", err)
			}
			start = procStatus(t, "VmRSS")
			return
		}
		// What the phase held above what it leaves: on the CPU backend
		// device memory becomes resident as it is first written (a
		// restore's or the initial weights' uploads), which is the
		// plan's device memory, not the phase's.
		hwm := procStatus(t, "VmHWM")
		peak = max(peak, hwm)
		debug.FreeOSMemory()
		end := max(start, procStatus(t, "VmRSS"))
		ph := phases[name]
		ph.Grew, ph.Bound = max(ph.Grew, hwm-end), bound
		phases[name] = ph
	}
	defer func() { phaseHook = nil }()
	var m Measurements
	if _, err := Run(context.Background(), c, Options{Measurements: &m}); err != nil {
		t.Fatal(err)
	}
	for _, x := range m.Memory.Transient {
		if ph, ok := phases[x.Name]; ok {
			ph.Planned = x.Bytes
			phases[x.Name] = ph
		}
	}
	res := hostMemResult{IdleRSS: idle, PeakRSS: max(peak, procStatus(t, "VmHWM")), Plan: m.Memory.HostPeak(),
		Detail: m.Memory.HostString(), Phases: phases}
	raw, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("hostmem-result: %s\n", raw)
}

// procStatus is the field of /proc/self/status named key, in bytes.
func procStatus(t *testing.T, key string) int64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", key)
	return 0
}

// TestHostMemTooSmall: a host budget below the plan's peak, given by
// --host-mem or, without it, by the machine's MemAvailable, is an error
// before training that names the flag, the bytes needed by part and the
// budget, and nothing is written.
func TestHostMemTooSmall(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hostMem int64
		meminfo string // "" keeps the real /proc/meminfo
		want    []string
	}{
		{"flag", 1 << 20, "", []string{"the budget (--host-mem) is 1048576 bytes"}},
		{"available", 0, "MemTotal:       16000 kB\nMemFree:         1000 kB\nMemAvailable:    2048 kB\n",
			[]string{"MemAvailable", "--host-mem sets another budget", "is 2097152 bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.meminfo != "" {
				old := meminfoPath
				meminfoPath = writeFile(t, filepath.Join(t.TempDir(), "meminfo"), tc.meminfo)
				defer func() { meminfoPath = old }()
			}
			c := quickConfig(t, "tiny")
			c.HostMem = tc.hostMem
			_, plan := memoryPlan(t, c) // without the data: a little less than the run's
			_, err := Run(context.Background(), c, Options{})
			wantErr(t, err, append(tc.want, "--host-mem", "bytes of host memory", "device memory (cpu backend)",
				"checkpoint write", "(the peak's)")...)
			var fe *FlagError
			if !errors.As(err, &fe) || fe.Flag != "host-mem" {
				t.Errorf("error %v is not a FlagError for host-mem", err)
			}
			var need int64
			if _, serr := fmt.Sscanf(err.Error()[strings.Index(err.Error(), "needs "):], "needs %d bytes", &need); serr != nil || need < plan.HostPeak() {
				t.Errorf("error %q: needs %d bytes (%v), want at least the plan's %d", err, need, serr, plan.HostPeak())
			}
			if _, err := os.Stat(filepath.Join(c.Out, checkpoint.FileName)); err == nil {
				t.Errorf("checkpoint written despite the memory error")
			}
		})
	}
}

// TestMemAvailable reads MemAvailable in bytes, and says when a file
// lacks it or spells it otherwise.
func TestMemAvailable(t *testing.T) {
	checkProcReader(t, "memAvailable()", &meminfoPath, memAvailable, []procCase{
		{"MemTotal: 100 kB\nMemAvailable:     1234 kB\nBuffers: 1 kB\n", 1234 << 10, true},
		{"MemTotal: 100 kB\n", 0, false},
		{"MemAvailable: 12 MB\n", 0, false},
		{"MemAvailable: -3 kB\n", 0, false},
	})
}

// procCase is the text of a /proc file and what a reader of one of its
// fields returns for it: the bytes, and whether it knows them.
type procCase struct {
	text string
	want int64
	ok   bool
}

// checkProcReader points *path at a file of each case's text in turn and
// holds read to the case, then at a missing file, of which read must say
// it does not know; *path is restored after.
func checkProcReader(t *testing.T, name string, path *string, read func() (int64, bool), cases []procCase) {
	t.Helper()
	old := *path
	defer func() { *path = old }()
	dir := t.TempDir()
	for _, tc := range cases {
		*path = writeFile(t, filepath.Join(dir, "proc"), tc.text)
		if got, ok := read(); got != tc.want || ok != tc.ok {
			t.Errorf("%s of %q = %d, %v; want %d, %v", name, tc.text, got, ok, tc.want, tc.ok)
		}
	}
	*path = filepath.Join(dir, "absent")
	if _, ok := read(); ok {
		t.Errorf("%s of a missing file says it knows", name)
	}
}

// TestResolveGradResidency: --grad-residency auto keeps zero mode's whole
// gradient on the device when the run's plan fits --device-mem (or there
// is no budget), the ring otherwise; lsp takes the ring (the same bits,
// its traffic hidden); several ranks keep it whole, and a residency given
// is kept.
func TestResolveGradResidency(t *testing.T) {
	c := Defaults()
	c.Mode = engine.Zero
	mc, whole := memoryPlan(t, c)
	need := whole.DeviceTotal()
	lspc := c
	lspc.Mode = engine.LSP
	given := c
	given.GradResidency = engine.ResidencyWhole
	for _, tc := range []struct {
		name   string
		c      Config
		ranks  int
		budget int64
		want   engine.GradResidency
	}{
		{"no budget", c, 1, 0, engine.ResidencyWhole},
		{"fits", c, 1, need, engine.ResidencyWhole},
		{"one byte short", c, 1, need - 1, engine.ResidencyRing},
		{"two ranks", c, 2, need - 1, engine.ResidencyWhole},
		{"lsp", lspc, 1, 0, engine.ResidencyRing},
		{"lsp, two ranks", lspc, 2, 0, engine.ResidencyWhole},
		{"given", given, 1, 1, engine.ResidencyWhole},
	} {
		got, err := ResolveGradResidency(mc, tc.c, tc.ranks, tc.budget)
		if err != nil {
			t.Fatal(err)
		}
		if got.GradResidency != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got.GradResidency, tc.want)
		}
	}
	c.GradResidency = engine.ResidencyRing
	ring, err := MemoryOf(mc, c)
	if err != nil {
		t.Fatal(err)
	}
	if ring.DeviceTotal() >= need {
		t.Errorf("the ring's plan needs %d bytes of the device, the whole gradient's %d", ring.DeviceTotal(), need)
	}
	c.Mode = engine.Native
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--grad-residency") {
		t.Errorf("ring in native mode: error %v, want one naming --grad-residency", err)
	}
}
