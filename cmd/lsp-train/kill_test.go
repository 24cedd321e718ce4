// Crash safety proven by killing: the train command runs as a child
// process that is killed with SIGKILL (by itself at a named write point
// of train/faults, or by the test at a seeded random moment) and then
// resumed, again and again. After every kill the output directory must
// hold a checkpoint that loads (once one was written), an hf/ that loads
// or none, and metrics that parse; at the end the checkpoint, the export
// and every step's and eval's metrics must equal those of an
// uninterrupted run bit for bit.
//
// The child is this test binary re-executed (TestMain runs the command
// when LSP_TRAIN_CHILD is set) rather than a binary built with go build:
// it is the code under test exactly as compiled, and no compile (with
// cgo, the slow part) is paid inside the test.
//
// TestKillNamedPoints kills once at every named point (about 15 kills, a
// few seconds); it skips under -short, as child processes under -race are
// slow, and runs in make test's race-free pass. TestKillRandom adds
// seeded random kills (points and moments); LSP_KILL_TEST_KILLS sets how
// many (make test-kill), LSP_KILL_TEST_SEED the seed, to replay a failure.

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/faults"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// childEnv makes the test binary run the train command with its
// arguments instead of the tests.
const childEnv = "LSP_TRAIN_CHILD"

// noteExitEnv makes such a child print its exit status (and its MPI rank)
// as its last line, whichever goroutine ends it: under mpirun, the only
// way to learn that a rank exited by itself rather than by mpirun's
// SIGKILL.
const noteExitEnv = "LSP_TRAIN_CHILD_NOTE_EXIT"

// childCmd is the command run as a child process in dir ("" for this
// one) with args, and env (a fault to arm, or "" for none) added to the
// environment.
func childCmd(dir string, args []string, env string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	if env != "" {
		cmd.Env = append(cmd.Env, env)
	}
	cmd.Dir = dir
	return cmd
}

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		if os.Getenv(noteExitEnv) == "1" {
			exit = func(code int) {
				fmt.Fprintf(os.Stderr, "test child: rank %s exits with status %d\n", os.Getenv("OMPI_COMM_WORLD_RANK"), code)
				os.Exit(code)
			}
		}
		exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// killModel is a micro GPT-2 (one layer, 32 channels) committed as a
// Hugging Face directory, so a whole run takes a fraction of a second.
const killModel = "../../train/testdata/checkpoint-v2/model"

// killModelConfig is killModel's configuration, which its checkpoints
// are loaded with.
func killModelConfig(t *testing.T) gpt2.Config {
	t.Helper()
	mc, err := gpt2.ReadHFConfig(killModel)
	if err != nil {
		t.Fatal(err)
	}
	return mc
}

// killArgs is the run every kill test repeats: 6 steps, an eval every 2
// steps and a checkpoint every 2 steps (so kills land between checkpoints
// too), in mode.
func killArgs(out, mode string) []string {
	args := []string{"--model", killModel, "--data", "builtin:reverse:300", "--steps", "6", "--batch", "4",
		"--seq-len", "24", "--warmup", "2", "--eval-every", "2", "--eval-generate", "2", "--checkpoint-every", "2",
		"--threads", "1", "--mode", mode, "--out", out}
	if mode == "lsp" {
		args = append(args, "--d", "8", "--r", "2", "--dense-params", "device", "--check-every", "2",
			"--calib-samples", "4", "--fit-iters", "20", "--fit")
	}
	return args
}

// child is one run of the command.
type child struct {
	killed bool // ended by SIGKILL
	out    string
}

// runChild runs the command with args; env arms a fault (or is empty)
// and killAfter > 0 sends SIGKILL after that long. A run that neither
// succeeds nor is killed fails the test.
func runChild(t *testing.T, args []string, env string, killAfter time.Duration) child {
	t.Helper()
	cmd := childCmd("", args, env)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if killAfter > 0 {
		tm := time.AfterFunc(killAfter, func() { cmd.Process.Kill() })
		defer tm.Stop()
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return child{killed: true, out: buf.String()}
		}
	}
	if err != nil {
		t.Fatalf("lsp-train %s (%s): %v\n%s", strings.Join(args, " "), env, err, buf.String())
	}
	return child{out: buf.String()}
}

// killRun is the output directory of a run under kills and what the
// test knows of it.
type killRun struct {
	t     *testing.T
	out   string
	mode  string
	mc    gpt2.Config
	ckpt  bool // a checkpoint was seen: from now on one must always load
	kills int
}

func newKillRun(t *testing.T, mode string) *killRun {
	return &killRun{t: t, out: filepath.Join(t.TempDir(), "out"), mode: mode, mc: killModelConfig(t)}
}

// next runs the command once more: resuming when a checkpoint is there,
// else starting over (--overwrite, as a user would after a kill before
// the first checkpoint). It reports whether the run was killed.
func (k *killRun) next(env string, killAfter time.Duration) bool {
	k.t.Helper()
	args := killArgs(k.out, k.mode)
	if _, err := os.Stat(filepath.Join(k.out, checkpoint.FileName)); err == nil {
		args = append(args, "--resume")
	} else if _, err := os.Stat(k.out); err == nil {
		args = append(args, "--overwrite")
	}
	c := runChild(k.t, args, env, killAfter)
	if c.killed {
		k.kills++
		k.check(env)
	}
	return c.killed
}

// check is what must hold in the output directory after a kill.
func (k *killRun) check(what string) {
	k.t.Helper()
	path := filepath.Join(k.out, checkpoint.FileName)
	if _, err := os.Stat(path); err == nil || k.ckpt {
		if _, err := checkpoint.Load(path, k.mc, nil); err != nil {
			k.t.Fatalf("after a kill (%s) the checkpoint does not load: %v", what, err)
		}
		k.ckpt = true
	}
	if _, err := os.Stat(filepath.Join(k.out, "hf")); err == nil {
		if _, _, err := gpt2.LoadHF(filepath.Join(k.out, "hf")); err != nil {
			k.t.Fatalf("after a kill (%s) hf/ is there but does not load: %v", what, err)
		}
	}
	if _, err := os.Stat(filepath.Join(k.out, "metrics.jsonl")); err == nil {
		if _, err := metrics.ReadFile(filepath.Join(k.out, "metrics.jsonl")); err != nil {
			k.t.Fatalf("after a kill (%s) the metrics do not parse: %v", what, err)
		}
	}
}

// finish resumes until the run completes, then compares it with ref.
func (k *killRun) finish(ref string) {
	k.t.Helper()
	if k.next("", 0) {
		k.t.Fatal("a run with no fault armed was killed")
	}
	sameRun(k.t, ref, k.out)
	ents, err := os.ReadDir(k.out)
	if err != nil {
		k.t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			k.t.Errorf("%s left in %s after the run finished", e.Name(), k.out)
		}
	}
}

// reference runs the command once without kills and returns its output
// directory and how long the run took.
func reference(t *testing.T, mode string) (string, time.Duration) {
	out := filepath.Join(t.TempDir(), "ref")
	t0 := time.Now()
	if c := runChild(t, killArgs(out, mode), "", 0); c.killed {
		t.Fatal("the reference run was killed")
	}
	return out, time.Since(t0)
}

// sameRun fails unless the runs in directories a and b ended with the
// same checkpoint (every tensor and the state), the same export, and the
// same metrics records except their wall times.
func sameRun(t *testing.T, a, b string) {
	t.Helper()
	for _, f := range []string{checkpoint.FileName, "hf/model.safetensors"} {
		fa, fb := openTensors(t, a, f), openTensors(t, b, f)
		if !slices.Equal(fa.Names(), fb.Names()) {
			t.Fatalf("%s: tensors %v vs %v", f, fa.Names(), fb.Names())
		}
		for _, name := range fa.Names() {
			if !bytes.Equal(rawTensor(t, fa, name), rawTensor(t, fb, name)) {
				t.Errorf("%s: tensor %s differs from the uninterrupted run's", f, name)
			}
		}
		if !maps.Equal(fa.Metadata, fb.Metadata) {
			t.Errorf("%s: metadata %v differs from the uninterrupted run's %v", f, fb.Metadata, fa.Metadata)
		}
	}
	ma, mb := metricLines(t, a), metricLines(t, b)
	if !slices.Equal(ma, mb) {
		t.Errorf("metrics differ from the uninterrupted run's:\n%s\nvs\n%s", strings.Join(mb, "\n"), strings.Join(ma, "\n"))
	}
}

// openTensors opens the safetensors file f of the run in dir.
func openTensors(t *testing.T, dir, f string) *safetensors.File {
	t.Helper()
	st, err := safetensors.Open(filepath.Join(dir, f))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// rawTensor is the bytes of the tensor name in st.
func rawTensor(t *testing.T, st *safetensors.File, name string) []byte {
	t.Helper()
	raw, _, err := st.Raw(name)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// metricLines are the records of dir's metrics.jsonl without their
// times and throughputs, which differ between runs.
func metricLines(t *testing.T, dir string) []string {
	t.Helper()
	recs := readMetrics(t, dir)
	var lines []string
	for _, r := range recs {
		r.Time, r.TokensPerSec = 0, nil
		if r.Projector != nil {
			r.Projector.Seconds = 0
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(b))
	}
	return lines
}

// namedKills are the kills of TestKillNamedPoints: each named point of
// the write sequences, at a passing where an earlier complete write of
// the same file exists when one can (n = 2), and before any checkpoint.
var namedKills = []string{
	// The checkpoint: before it was ever written (no checkpoint: the
	// next run starts over), then the second one, at every point.
	"temp-partial@" + checkpoint.FileName + ":1",
	"temp-partial@" + checkpoint.FileName + ":2",
	"temp-written@" + checkpoint.FileName + ":2",
	"temp-fsynced@" + checkpoint.FileName + ":2",
	"renamed@" + checkpoint.FileName + ":2",
	"dir-fsynced@" + checkpoint.FileName + ":2",
	// The Hugging Face export, file by file and as a directory.
	"temp-partial@model.safetensors",
	"temp-fsynced@config.json",
	"dir-written@hf",
	"dir-renamed@hf",
	// metrics.jsonl: mid-line, after a line, and its rewrite on resume.
	"metrics-partial@metrics.jsonl:3",
	"metrics-appended@metrics.jsonl:5",
	// The loss plot, a step and an evaluation.
	"temp-partial@loss.png",
	"step:3",
	"eval:2",
	// The end: after the last checkpoint (before the export), and the
	// final evaluation, which comes before the last checkpoint.
	"dir-fsynced@" + checkpoint.FileName + ":3",
	"eval:3",
}

// TestKillNamedPoints kills the run once at each named write point, then
// resumes it to the end: nothing is lost.
func TestKillNamedPoints(t *testing.T) {
	skipChildProcesses(t)
	ref, _ := reference(t, "native")
	total := 0
	for _, spec := range namedKills {
		t.Run(spec, func(t *testing.T) {
			k := newKillRun(t, "native")
			if !k.next(faults.KillEnv+"="+spec, 0) {
				t.Fatalf("%s was never reached: the run finished", spec)
			}
			total += k.kills
			k.finish(ref)
		})
	}
	// The metrics rewrite of a resumed run: kill it on resume, twice.
	t.Run("resume rewrite", func(t *testing.T) {
		k := newKillRun(t, "native")
		for _, spec := range []string{"step:3", "temp-partial@metrics.jsonl", "renamed@metrics.jsonl"} {
			if !k.next(faults.KillEnv+"="+spec, 0) {
				t.Fatalf("%s was never reached: the run finished", spec)
			}
		}
		total += k.kills
		k.finish(ref)
	})
	if !t.Failed() {
		t.Logf("%d kills at named points, every one survived", total)
	}
}

// killPoints are the points a random kill picks from, with the largest
// passing count that a 6-step run surely reaches in its first process.
var killPoints = []struct {
	spec string
	max  int
}{
	{"temp-partial@" + checkpoint.FileName, 3}, {"temp-written@" + checkpoint.FileName, 3},
	{"temp-fsynced@" + checkpoint.FileName, 3}, {"renamed@" + checkpoint.FileName, 3},
	{"dir-fsynced@" + checkpoint.FileName, 3},
	{"temp-partial@model.safetensors", 1}, {"dir-written@hf", 1}, {"dir-renamed@hf", 1},
	{"metrics-partial@metrics.jsonl", 9}, {"metrics-appended@metrics.jsonl", 9},
	{"temp-written@metrics.jsonl", 1}, {"temp-written@loss.png", 1},
	{"step", 6}, {"eval", 3},
}

// killModes are the update modes TestKillRandom runs, each for its share
// of the kills.
var killModes = []string{"native", "zero", "lsp"}

// TestKillRandom kills runs at seeded random points and moments, several
// times per run, in native and zero mode, then resumes each to the end.
func TestKillRandom(t *testing.T) {
	skipChildProcesses(t)
	want := 6
	if s := os.Getenv("LSP_KILL_TEST_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("LSP_KILL_TEST_KILLS=%q is not a positive integer", s)
		}
		want = n
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("LSP_KILL_TEST_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LSP_KILL_TEST_SEED=%q: %v", s, err)
		}
		seed = n
	}
	t.Logf("seed %d (replay with LSP_KILL_TEST_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x6b696c6c))
	total, byKind := 0, map[string]int{}
	for _, mode := range killModes {
		ref, took := reference(t, mode)
		for run := 0; total < want*(1+slices.Index(killModes, mode))/len(killModes); run++ {
			t.Run(fmt.Sprintf("%s/%d", mode, run), func(t *testing.T) {
				k := newKillRun(t, mode)
				// Up to four kills per run, each at a point or a moment.
				for range 1 + rng.IntN(4) {
					if rng.IntN(3) == 0 {
						after := time.Duration(rng.Int64N(int64(took)))
						if k.next("", after) {
							byKind["moment"]++
						}
						continue
					}
					p := killPoints[rng.IntN(len(killPoints))]
					spec := fmt.Sprintf("%s:%d", p.spec, 1+rng.IntN(p.max))
					if k.next(faults.KillEnv+"="+spec, 0) {
						byKind[p.spec]++
					}
				}
				total += k.kills
				k.finish(ref)
			})
			if t.Failed() {
				return
			}
		}
	}
	if total < want {
		t.Errorf("only %d kills landed, want %d", total, want)
	}
	t.Logf("%d kills survived (seed %d): %v", total, seed, byKind)
}
