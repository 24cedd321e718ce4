// Tests of the resume check: every Config field is part of the resume
// identity, allowed to change on resume, or listed here as never
// recorded, so a new setting cannot be forgotten; the settings survive
// the checkpoint's state; a refused change names each differing flag
// with both values; an allowed one is logged; a checkpoint from before
// the settings were recorded is checked on what it has.

package train

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
)

// resumeNotRecorded are the Config fields that are neither part of the
// identity nor a setting a resume may change: they say where the run is
// and how it starts, and so are not saved in its checkpoint.
var resumeNotRecorded = map[string]string{
	"Resume":    "differs by definition",
	"Out":       "where the checkpoint is; resume reads it from there",
	"Overwrite": "what happens to an earlier run's outputs; contradicts --resume (Validate)",
}

// loggedRun runs c to the end and returns its result and its text log.
func loggedRun(t *testing.T, c Config) (*Result, string) {
	t.Helper()
	var logged bytes.Buffer
	res := mustRun(t, context.Background(), c, Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	return res, logged.String()
}

// lastWarning is the last line of a text log that warns of what, or "".
func lastWarning(log, what string) string {
	var warning string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, what) {
			warning = line
		}
	}
	return warning
}

func fieldNames(t reflect.Type) map[string]reflect.StructField {
	m := map[string]reflect.StructField{}
	for i := range t.NumField() {
		m[t.Field(i).Name] = t.Field(i)
	}
	return m
}

// TestResumeSettingsCoverConfig fails when a Config field is in none of
// resumeIdentity, resumeAllowed and resumeNotRecorded, or in two; when a
// field's type differs from Config's; when a flag tag is missing or
// repeated; and when a state:"field" setting has no checkpoint.State
// field of its name and type.
func TestResumeSettingsCoverConfig(t *testing.T) {
	cfg := fieldNames(reflect.TypeFor[Config]())
	id := fieldNames(reflect.TypeFor[resumeIdentity]())
	allowed := fieldNames(reflect.TypeFor[resumeAllowed]())
	st := fieldNames(reflect.TypeFor[checkpoint.State]())
	for name := range cfg {
		_, inID := id[name]
		_, inAllowed := allowed[name]
		_, notRecorded := resumeNotRecorded[name]
		switch n := btoi(inID) + btoi(inAllowed) + btoi(notRecorded); {
		case n == 0:
			t.Errorf("Config.%s is in none of resumeIdentity and resumeAllowed (resume.go) and resumeNotRecorded (this file): "+
				"if it changes what a run computes, add it to the identity; if a resume may change it, to resumeAllowed", name)
		case n > 1:
			t.Errorf("Config.%s is in more than one of resumeIdentity, resumeAllowed and resumeNotRecorded", name)
		}
	}
	for name := range resumeNotRecorded {
		if _, ok := cfg[name]; !ok {
			t.Errorf("resumeNotRecorded lists %s, which Config does not have", name)
		}
	}
	flags := map[string]bool{}
	for _, fields := range []map[string]reflect.StructField{id, allowed} {
		for name, f := range fields {
			if c, ok := cfg[name]; !ok || c.Type != f.Type {
				t.Errorf("%s has no Config field of its name and type", name)
			}
			flag := f.Tag.Get("flag")
			if flag == "" || flags[flag] {
				t.Errorf("%s: flag tag %q missing or repeated", name, flag)
			}
			flags[flag] = true
			if f.Tag.Get("state") == "field" {
				if s, ok := st[name]; !ok || s.Type != f.Type {
					t.Errorf("%s is marked state:\"field\" but checkpoint.State has no field of its name and type", name)
				}
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// filled is a Config whose resume settings all hold non-zero values that
// differ from Defaults', in lsp mode so that its lsp-only settings count
// too.
func filled(t *testing.T) Config {
	t.Helper()
	c := Defaults()
	v := reflect.ValueOf(&c).Elem()
	for i, sf := range append(reflect.VisibleFields(reflect.TypeFor[resumeIdentity]()), reflect.VisibleFields(reflect.TypeFor[resumeAllowed]())...) {
		f := v.FieldByName(sf.Name)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Int, reflect.Int64:
			f.SetInt(f.Int() + int64(i+2))
		case reflect.Uint8, reflect.Uint64:
			f.SetUint(f.Uint() + 1)
		case reflect.Float64:
			f.SetFloat(f.Float() + 0.25)
		case reflect.Bool:
			f.SetBool(!f.Bool())
		default:
			t.Fatalf("Config.%s: kind %v has no test value", sf.Name, f.Kind())
		}
	}
	c.Mode = engine.LSP
	return c
}

// TestResumeSettingsRoundTrip: every setting a run saves is read back as
// it was, so resuming with the same Config changes and refuses nothing.
func TestResumeSettingsRoundTrip(t *testing.T) {
	c := filled(t)
	var st checkpoint.State
	saveSettings(&st, c.resumeIdentity(false), c.resumeAllowed())
	saved := savedSettings(st)
	for _, s := range append(settingsOf(c.resumeIdentity(false)), settingsOf(c.resumeAllowed())...) {
		if saved[s.flag] != s.text {
			t.Errorf("--%s saved as %q, the run has %q", s.flag, saved[s.flag], s.text)
		}
	}
	if back := savedIdentity(st); back.Batch != c.Batch || back.DenseParams != c.DenseParams || back.D != c.D {
		t.Errorf("the State fields do not hold the identity: %+v", back)
	}
	refused, changed, unrecorded := resumeDiff(saved, c.resumeIdentity(false), c.resumeAllowed())
	if len(refused)+len(changed)+len(unrecorded) > 0 {
		t.Errorf("a run differs from its own checkpoint: refused %v, changed %v, unrecorded %v", refused, changed, unrecorded)
	}
	// Outside lsp mode the lsp-only settings are zero, as a checkpoint
	// of another mode holds them.
	c.Mode = engine.Zero
	if id := c.resumeIdentity(false); id.DenseParams != "" || id.D != 0 || id.R != 0 || id.Alpha != 0 || id.Fit {
		t.Errorf("zero mode identity holds lsp settings: %+v", id)
	}
	// The default of --dense-params is resolved.
	c = Defaults()
	c.Mode = engine.LSP
	if a, b := c.resumeIdentity(false).DenseParams, c.resumeIdentity(true).DenseParams; a != engine.DenseDevice || b != engine.DenseFrozen {
		t.Errorf("dense params resolved to %q (preset), %q (checkpoint); want device, frozen", a, b)
	}
}

// TestResumeDiff: each refused flag is one line with the checkpoint's
// value and this run's; allowed changes are returned, not refused; lsp
// settings count only when both runs are lsp; a checkpoint without
// recorded settings is checked on its State fields and names the rest.
func TestResumeDiff(t *testing.T) {
	saved := Defaults()
	saved.Mode, saved.D, saved.R, saved.LR = engine.LSP, 8, 2, 0.001
	var st checkpoint.State
	saveSettings(&st, saved.resumeIdentity(false), saved.resumeAllowed())

	now := saved
	now.LR, now.Batch, now.Truncate, now.R, now.Alpha = 0.002, 4, true, 3, 0.75
	now.Projector = lsp.KindGaussian
	now.Steps, now.EvalEvery, now.Threads = 1000, 7, 3 // allowed
	refused, changed, _ := resumeDiff(savedSettings(st), now.resumeIdentity(false), now.resumeAllowed())
	var lines []string
	for _, ch := range refused {
		lines = append(lines, ch.String())
	}
	want := []string{
		"--batch: checkpoint has 32, command line has 4",
		"--truncate: checkpoint has false, command line has true",
		"--r: checkpoint has 2, command line has 3",
		"--lr: checkpoint has 0.001, command line has 0.002",
		"--alpha: checkpoint has 0.5, command line has 0.75",
		"--projector: checkpoint has sparse, command line has gaussian",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("refused:\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	var names []string
	for _, ch := range changed {
		names = append(names, ch.flag+" "+ch.was+" "+ch.now)
	}
	if got := strings.Join(names, ", "); got != "steps 0 1000, eval-every 100 7, threads 0 3" {
		t.Errorf("allowed changes: %s", got)
	}

	// Native against lsp: --mode differs; lsp's settings are not named.
	now = saved
	now.Mode = engine.Native
	refused, _, _ = resumeDiff(savedSettings(st), now.resumeIdentity(false), now.resumeAllowed())
	if len(refused) != 1 || refused[0].String() != "--mode: checkpoint has lsp, command line has native" {
		t.Errorf("lsp checkpoint, native run: refused %v", refused)
	}

	// A checkpoint from before the settings were recorded: its State
	// fields are checked, the rest is named as unrecorded.
	st.Settings = nil
	now = saved
	now.LR, now.SeqLen = 0.5, 12
	refused, changed, unrecorded := resumeDiff(savedSettings(st), now.resumeIdentity(false), now.resumeAllowed())
	if len(refused) != 1 || refused[0].flag != "seq-len" || len(changed) != 0 {
		t.Errorf("old checkpoint: refused %v, changed %v; want --seq-len only", refused, changed)
	}
	if u := strings.Join(unrecorded, " "); !strings.Contains(u, "--lr") || !strings.Contains(u, "--fit") || strings.Contains(u, "--batch") {
		t.Errorf("old checkpoint: unrecorded %s", u)
	}

	// A checkpoint that recorded --no-fit (before --fit was opt-in) is
	// read as its negation: a fitted run resumes only with --fit.
	st.Settings = map[string]string{"no-fit": "false"}
	if got := savedSettings(st); got["fit"] != "true" || got["no-fit"] != "" {
		t.Errorf("--no-fit false read as fit %q (no-fit %q), want fit true", got["fit"], got["no-fit"])
	}
	// An lsp run from before --projector had sparse projectors.
	if got := savedSettings(checkpoint.State{Mode: engine.LSP}); got["projector"] != "sparse" {
		t.Errorf("an lsp checkpoint without --projector read as %q, want sparse", got["projector"])
	}
	// One that recorded --start-random (before --check-at-start) likewise.
	for was, want := range map[string]string{"true": "false", "false": "true"} {
		old := st
		old.Settings = map[string]string{"start-random": was}
		if got := savedSettings(old); got["check-at-start"] != want || got["start-random"] != "" {
			t.Errorf("--start-random %s read as check-at-start %q (start-random %q), want %s", was, got["check-at-start"], got["start-random"], want)
		}
	}
	now = saved
	now.Mode, now.Fit = engine.LSP, false
	st.Mode = engine.LSP
	refused, _, _ = resumeDiff(savedSettings(st), now.resumeIdentity(false), now.resumeAllowed())
	if !slices.ContainsFunc(refused, func(c change) bool { return c.String() == "--fit: checkpoint has true, command line has false" }) {
		t.Errorf("a fitted run resumed without --fit: refused %v", refused)
	}
}

// TestResumeChangedSettings runs, then resumes with a changed learning
// rate (refused, one line per flag, nothing trained), and with a longer
// run and another eval cadence (allowed, each change logged).
func TestResumeChangedSettings(t *testing.T) {
	c := quickConfig(t, writeModel(t, microConfig(16, 1)))
	c.Steps, c.EvalEvery = 2, 0
	mustRun(t, context.Background(), c, Options{})
	ck := filepath.Join(c.Out, checkpoint.FileName)
	before, err := os.ReadFile(ck)
	if err != nil {
		t.Fatal(err)
	}

	bad := c
	bad.Resume, bad.LR, bad.Warmup = true, c.LR*2, 5
	_, err = Run(context.Background(), bad, Options{})
	wantErr(t, err, "resume: "+ck, "\n  --lr: checkpoint has 0.003, command line has 0.006",
		"\n  --warmup: checkpoint has 2, command line has 5")
	if strings.Contains(err.Error(), "--batch") || strings.Contains(err.Error(), "--steps") {
		t.Errorf("the error names flags that did not change: %v", err)
	}
	if after, _ := os.ReadFile(ck); !bytes.Equal(before, after) {
		t.Errorf("a refused resume changed the checkpoint")
	}

	ok := c
	ok.Resume, ok.Steps, ok.EvalEvery = true, 3, 1
	res, logged := loggedRun(t, ok)
	if res.Steps != 3 || res.StepsRun != 1 || res.ResumedAt != 2 {
		t.Errorf("resumed run: steps %d, run %d, resumed at %d; want 3, 1, 2", res.Steps, res.StepsRun, res.ResumedAt)
	}
	for _, want := range []string{"flag=--steps checkpoint=2 now=3", "flag=--eval-every checkpoint=0 now=1"} {
		if !strings.Contains(logged, want) {
			t.Errorf("the log does not hold %q:\n%s", want, logged)
		}
	}
	if strings.Contains(logged, "predates") {
		t.Errorf("a checkpoint with recorded settings was called old:\n%s", logged)
	}
}

// TestResumeOldCheckpointWarns: resuming a version-2 checkpoint, which
// holds none of the recorded settings, warns naming those it cannot
// check.
func TestResumeOldCheckpointWarns(t *testing.T) {
	_, logged := loggedRun(t, resumeFixture(t, "native", filepath.Join(t.TempDir(), "out")))
	if warning := lastWarning(logged, "predates"); !strings.Contains(warning, "--lr") || strings.Contains(warning, "--batch") {
		t.Errorf("no warning naming --lr (and not --batch, which it holds); the log:\n%s", logged)
	}
}

// TestResumeDefaultDChange: a checkpoint of the old default --d 512
// resumed without --d names both defaults, not a bare 0.
func TestResumeDefaultDChange(t *testing.T) {
	got := change{"d", "512", "0"}.String()
	if !strings.Contains(got, "checkpoint has 512") || !strings.Contains(got, "the default was 512 before") {
		t.Errorf("change: %q", got)
	}
}
