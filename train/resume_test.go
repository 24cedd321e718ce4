// Tests of the resume identity: every Config field is either part of it
// or listed here as allowed to differ on resume, so a new setting that
// changes the computation cannot be forgotten; the identity survives the
// checkpoint's state; a mismatch names each differing flag with both
// values.

package train

import (
	"reflect"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/engine"
)

// resumeMayDiffer are the Config fields a resumed run may set differently
// from the run that saved the checkpoint. A new Config field goes either
// into resumeIdentity (resume.go) or here, with the reason.
var resumeMayDiffer = map[string]string{
	// How long and how the run goes on, not what it computes.
	"Steps":           "a run may be extended or cut short",
	"Epochs":          "as --steps",
	"EvalEvery":       "evaluation reads the weights, never changes them",
	"EvalGenerate":    "as --eval-every",
	"CheckpointEvery": "checkpoints are bit-for-bit resumable at any step",
	"Resume":          "differs by definition",
	"Out":             "where the checkpoint is; resume reads it from there",
	"Overwrite":       "what happens to an earlier run's outputs, not what this run computes",
	"Model":           "checked by architecture instead: checkpoint.Load refuses another model's checkpoint",

	// Where and how fast it runs: same results bit for bit.
	"Threads":       "results do not depend on the thread count (TestDeterministic)",
	"Device":        "the backend; the state is saved as fp32 values any backend loads",
	"DeviceMem":     "a budget, checked against the plan, not an input of the math",
	"Schedule":      "pipelined and sequential give identical weights (engine TestPipelinedMatchesSequential)",
	"LinkBandwidth": "charges time on the CPU backend only",

	// What happens to a step whose loss is not finite: a finite step
	// computes the same with either value, a skipped one changes nothing,
	// and a run stopped by a NaN is meant to be resumed with skip.
	"OnNonFinite": "finite steps compute the same either way; a skipped step updates nothing",
	"MaxSkips":    "as --on-nonfinite",

	// These change the computation but have always been allowed to differ
	// on resume (the schedule and optimizer settings of a continued run);
	// whether to refuse them is issue 13's decision, not this list's.
	"LR":           "learning-rate schedule",
	"MinLR":        "learning-rate schedule",
	"Warmup":       "learning-rate schedule",
	"WeightDecay":  "AdamW hyperparameter",
	"Beta1":        "AdamW hyperparameter",
	"Beta2":        "AdamW hyperparameter",
	"ClipMode":     "clipping",
	"GradClip":     "clipping",
	"GradDType":    "gradient storage (native and zero)",
	"Alpha":        "lsp projector checks",
	"CheckEvery":   "lsp projector checks",
	"CalibSamples": "lsp projector checks",
	"ProjLR":       "lsp projector fit",
	"FitIters":     "lsp projector fit",
	"NoFit":        "lsp projector fit",
}

func fieldNames(t reflect.Type) map[string]reflect.StructField {
	m := map[string]reflect.StructField{}
	for i := range t.NumField() {
		m[t.Field(i).Name] = t.Field(i)
	}
	return m
}

// TestResumeIdentityCoversConfig fails when a Config field is neither in
// the resume identity nor allowed to differ on resume.
func TestResumeIdentityCoversConfig(t *testing.T) {
	cfg := fieldNames(reflect.TypeFor[Config]())
	id := fieldNames(reflect.TypeFor[resumeIdentity]())
	st := fieldNames(reflect.TypeFor[checkpoint.State]())
	for name, f := range cfg {
		_, inID := id[name]
		_, mayDiffer := resumeMayDiffer[name]
		switch {
		case !inID && !mayDiffer:
			t.Errorf("Config.%s is neither in resumeIdentity (resume.go) nor in resumeMayDiffer (this file): "+
				"if it changes what a run computes, add it to the identity (and to checkpoint.State), else list it with the reason", name)
		case inID && mayDiffer:
			t.Errorf("Config.%s is both in resumeIdentity and in resumeMayDiffer", name)
		case inID && id[name].Type != f.Type:
			t.Errorf("resumeIdentity.%s is a %v, Config.%s a %v", name, id[name].Type, name, f.Type)
		}
	}
	for name := range resumeMayDiffer {
		if _, ok := cfg[name]; !ok {
			t.Errorf("resumeMayDiffer lists %s, which Config does not have", name)
		}
	}
	for name, f := range id {
		if _, ok := cfg[name]; !ok {
			t.Errorf("resumeIdentity.%s is not named as a Config field", name)
		}
		if s, ok := st[name]; !ok || s.Type != f.Type {
			t.Errorf("resumeIdentity.%s has no checkpoint.State field of its name and type", name)
		}
		if f.Tag.Get("flag") == "" {
			t.Errorf("resumeIdentity.%s has no flag tag", name)
		}
	}
}

// filled is a Config whose identity fields all hold non-zero values, in
// lsp mode so that its lsp-only fields count too.
func filled(t *testing.T) Config {
	t.Helper()
	var c Config
	v := reflect.ValueOf(&c).Elem()
	for i := range reflect.TypeFor[resumeIdentity]().NumField() {
		name := reflect.TypeFor[resumeIdentity]().Field(i).Name
		f := v.FieldByName(name)
		switch f.Kind() {
		case reflect.String:
			f.SetString("x" + name)
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(i + 2))
		case reflect.Uint8, reflect.Uint64:
			f.SetUint(uint64(i%2 + 1))
		case reflect.Float64:
			f.SetFloat(0.25)
		case reflect.Bool:
			f.SetBool(true)
		default:
			t.Fatalf("Config.%s: kind %v has no test value", name, f.Kind())
		}
	}
	c.Mode = engine.LSP
	return c
}

// TestResumeIdentityRoundTrip: the identity built from a Config holds
// every one of its fields, and survives the checkpoint's state.
func TestResumeIdentityRoundTrip(t *testing.T) {
	c := filled(t)
	id := c.resumeIdentity(false)
	iv, cv := reflect.ValueOf(id), reflect.ValueOf(c)
	for i := range iv.NumField() {
		name := iv.Type().Field(i).Name
		if !iv.Field(i).Equal(cv.FieldByName(name)) || iv.Field(i).IsZero() {
			t.Errorf("identity.%s = %v, Config.%s = %v", name, iv.Field(i), name, cv.FieldByName(name))
		}
	}
	var st checkpoint.State
	id.into(&st)
	if back := savedIdentity(st); back != id {
		t.Errorf("identity through the checkpoint state:\n%+v\nwant\n%+v", back, id)
	}
	if err := savedIdentity(st).mismatch(id, "ck"); err != nil {
		t.Errorf("an identity mismatches itself: %v", err)
	}
	// Outside lsp mode the lsp-only settings are not part of it.
	c.Mode = engine.Zero
	if id := c.resumeIdentity(false); id.DenseParams != "" || id.D != 0 || id.R != 0 {
		t.Errorf("zero mode identity holds lsp settings: %+v", id)
	}
	// The default of --dense-params is resolved.
	c = Defaults()
	c.Mode = engine.LSP
	if a, b := c.resumeIdentity(false).DenseParams, c.resumeIdentity(true).DenseParams; a != engine.DenseDevice || b != engine.DenseFrozen {
		t.Errorf("dense params resolved to %q (preset), %q (checkpoint); want device, frozen", a, b)
	}
}

// TestResumeMismatch: each differing flag is named with the saved value
// and this run's; lsp settings count only when both runs are lsp.
func TestResumeMismatch(t *testing.T) {
	saved := Defaults()
	saved.Mode, saved.D, saved.R = engine.LSP, 8, 2
	now := saved
	now.Batch, now.DType, now.Truncate, now.R = 4, backend.BF16, true, 3
	err := saved.resumeIdentity(false).mismatch(now.resumeIdentity(false), "out/ck")
	wantErr(t, err, "resume: out/ck was saved with", "--batch 32", "--dtype fp32", "--truncate=false", "--r 2",
		"this run has", "--batch 4", "--dtype bf16", "--truncate=true", "--r 3")
	if strings.Contains(err.Error(), "--seq-len") || strings.Contains(err.Error(), "--d ") {
		t.Errorf("error names flags that do not differ: %v", err)
	}

	now = saved
	now.Mode = engine.Native
	err = saved.resumeIdentity(false).mismatch(now.resumeIdentity(false), "ck")
	wantErr(t, err, "--mode lsp", "--mode native")
	if strings.Contains(err.Error(), "--d ") || strings.Contains(err.Error(), "--dense-params") {
		t.Errorf("lsp-only settings named for a native run: %v", err)
	}
}
