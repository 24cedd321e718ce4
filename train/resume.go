// The resume check: which settings a resumed run must share with the run
// that saved its checkpoint, which it may change, and the messages for
// both. Every setting is saved in the checkpoint; on resume a changed
// identity setting (resumeIdentity: anything that decides the data order
// or the math, the learning rate included) stops the run with one line
// per differing flag, and a changed allowed setting (resumeAllowed: the
// length of the run, its evaluation and checkpoint cadence, where and how
// fast it runs) is logged. resume_test.go fails on a Config field that is
// in neither.
//
// Limits: checkpoints written before the settings were recorded
// (checkpoint.State.Settings) hold only the first block of
// resumeIdentity; the other settings of such a resume go unchecked, with
// a warning naming them.

package train

import (
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// resumeIdentity is what decides the data order and the math of a run:
// a resume with any other value would not continue the run it claims to.
// Each field is named as the Config field it comes from; its tag is its
// flag; resume:"lsp" marks a setting only lsp mode has (zero in the other
// modes, compared only when both runs are in lsp mode), resume:"lora" one
// only lora mode has, resume:"lsp,lora" one both have (and so on, galore
// among them); state:"field"
// marks the settings that checkpoint.State holds as fields of their own
// name, which every checkpoint version has.
type resumeIdentity struct {
	DType        backend.DType      `flag:"dtype" state:"field"`
	Batch        int                `flag:"batch" state:"field"`
	SeqLen       int                `flag:"seq-len" state:"field"`
	GradAccum    int                `flag:"grad-accum" state:"field"`
	Data         string             `flag:"data" state:"field"`
	Seed         uint64             `flag:"seed" state:"field"`
	EvalFraction float64            `flag:"eval-fraction" state:"field"`
	Truncate     bool               `flag:"truncate" state:"field"`
	Mode         engine.Mode        `flag:"mode" state:"field"`
	DenseParams  engine.DenseParams `flag:"dense-params" resume:"lsp,lora,galore" state:"field"` // resolved: never "" in lsp, lora and galore modes
	D            int                `flag:"d" resume:"lsp" state:"field"`
	R            int                `flag:"r" resume:"lsp" state:"field"`
	LoRAR        int                `flag:"lora-r" resume:"lora"`
	LoRAAlpha    float64            `flag:"lora-alpha" resume:"lora"`
	LoRADropout  float64            `flag:"lora-dropout" resume:"lora"`
	LoRATargets  string             `flag:"lora-targets" resume:"lora"`
	BaseDType    string             `flag:"base-dtype" resume:"lora"`
	GaloreRank   int                `flag:"galore-rank" resume:"galore"`
	GaloreEvery  int                `flag:"galore-every" resume:"galore"`
	GaloreScale  float64            `flag:"galore-scale" resume:"galore"`

	// Recorded in checkpoint.State.Settings only. --pack decides what
	// each row holds (absent from runs before it: false).
	Pack         bool           `flag:"pack"`
	Tokenizer    string         `flag:"tokenizer"`
	LR           float64        `flag:"lr"`
	MinLR        float64        `flag:"min-lr"`
	Warmup       int            `flag:"warmup"`
	WeightDecay  float64        `flag:"weight-decay"`
	Beta1        float64        `flag:"beta1"`
	Beta2        float64        `flag:"beta2"`
	ClipMode     optim.ClipMode `flag:"clip-mode"`
	GradClip     float64        `flag:"grad-clip"`
	GradDType    backend.DType  `flag:"grad-dtype"`
	Alpha        float64        `flag:"alpha" resume:"lsp"`
	CheckEvery   int            `flag:"check-every" resume:"lsp"`
	CalibSamples int            `flag:"calib-samples" resume:"lsp"`
	ProjLR       float64        `flag:"proj-lr" resume:"lsp"`
	FitIters     int            `flag:"fit-iters" resume:"lsp"`
	Fit          bool           `flag:"fit" resume:"lsp"`
	Refit        lsp.Refit      `flag:"refit" resume:"lsp"`
	Accept       lsp.Accept     `flag:"accept" resume:"lsp"`
	Rewarm       lsp.Rewarm     `flag:"rewarm" resume:"lsp"`
	NoGain       bool           `flag:"no-gain" resume:"lsp"`
	ProjOrtho    float64        `flag:"proj-ortho" resume:"lsp"`
	CheckAtStart bool           `flag:"check-at-start" resume:"lsp"`
	ShareLayers  bool           `flag:"share-layers" resume:"lsp"`
	Projector    lsp.Kind       `flag:"projector" resume:"lsp"`

	// The text conversations are trained on. Its file's name, not its
	// content, is compared: a template edited in place goes unnoticed,
	// and without the flag the template is the one beside the tokenizer.
	ChatTemplate string `flag:"chat-template"`
}

// resumeAllowed are the settings a resumed run may change; each change is
// logged. The README's "Resuming" section lists them.
type resumeAllowed struct {
	// How long the run goes on: a run may be extended or cut short. The
	// cosine schedule then decays to the new last step from the resumed
	// one on, so the result differs from a run given that length at the
	// start.
	Steps  int     `flag:"steps"`
	Epochs float64 `flag:"epochs"`
	// Evaluation reads the weights and never changes them; checkpoints
	// resume bit for bit from any step.
	EvalEvery    int `flag:"eval-every"`
	EvalGenerate int `flag:"eval-generate"`
	EvalTokens   int `flag:"eval-tokens"`
	EvalMaxNew   int `flag:"eval-max-new"`
	// A held-out file of its own; the split it replaces is --eval-fraction,
	// an identity setting, since it decides the training set.
	EvalData        string `flag:"eval-data"`
	CheckpointEvery int    `flag:"checkpoint-every"`
	KeepCheckpoints int    `flag:"keep-checkpoints"`
	ExportEvery     int    `flag:"export-every"`
	// The weights come from the checkpoint; checkpoint.Load refuses one
	// of another architecture.
	Model string `flag:"model"`
	// lora's adapters too: --adapter is where a run started from, and
	// the shape it gave (--lora-r, --lora-alpha, --lora-targets) is in
	// the identity.
	Adapter string `flag:"adapter"`
	// Where and how fast it runs: the same results bit for bit (the
	// thread count: TestDeterministic; the schedule: engine
	// TestPipelinedMatchesSequential; recompute: engine
	// TestRecomputeBitIdentical; the budgets are checked against the
	// plan; the link bandwidth charges time on the CPU backend only).
	Device        device.Kind `flag:"device"`
	DeviceMem     int64       `flag:"device-mem"`
	HostMem       int64       `flag:"host-mem"`
	Threads       int         `flag:"threads"`
	Schedule      Schedule    `flag:"schedule"`
	LinkBandwidth int64       `flag:"link-bandwidth"`
	// Recomputation runs the forward's ops again on the same inputs: the
	// same bits (TestRecomputeBitIdentical), less memory.
	Recompute model.Recompute `flag:"recompute"`
	// Where zero mode's gradients wait on the device: the same bits with
	// one micro-batch or fp32 gradients (engine TestRingMatchesWhole);
	// with bf16 gradients and several micro-batches the ring sums them
	// in fp32 on the host, one bf16 rounding fewer per micro-batch.
	GradResidency engine.GradResidency `flag:"grad-residency"`
	// Where the ranks sum: both paths sum in rank order, the same bits
	// (engine TestDataParallelNCCL).
	Collectives Collectives `flag:"collectives"`
	// What happens to a step whose loss is not finite: a finite step
	// computes the same either way and a skipped one updates nothing, so
	// a run stopped by a NaN may be resumed with --on-nonfinite skip.
	OnNonFinite NonFinite `flag:"on-nonfinite"`
	MaxSkips    int       `flag:"max-skips"`
}

// resumeIdentity is the identity of a run of c; fromCheckpoint resolves
// the default of --dense-params.
func (c Config) resumeIdentity(fromCheckpoint bool) resumeIdentity {
	var id resumeIdentity
	fromConfig(&id, c)
	if c.Mode.FrozenMatrices() {
		id.DenseParams = c.denseParams(fromCheckpoint)
	}
	// Zero, as a checkpoint of another mode saves them.
	zeroOtherModes(&id)
	return id
}

// resumeAllowed is the part of c a resume may change.
func (c Config) resumeAllowed() resumeAllowed {
	var a resumeAllowed
	fromConfig(&a, c)
	return a
}

// fromConfig sets every field of the struct dst points to from the Config
// field of its name.
func fromConfig(dst any, c Config) {
	dv, cv := reflect.ValueOf(dst).Elem(), reflect.ValueOf(c)
	for i := range dv.NumField() {
		dv.Field(i).Set(cv.FieldByName(dv.Type().Field(i).Name))
	}
}

// zeroOtherModes zeroes the fields of the identity that id's mode does
// not have.
func zeroOtherModes(id *resumeIdentity) {
	v := reflect.ValueOf(id).Elem()
	for i := range v.NumField() {
		if !inMode(v.Type().Field(i).Tag.Get("resume"), id.Mode) {
			v.Field(i).SetZero()
		}
	}
}

// inMode says whether a setting whose resume tag is modes (comma-separated;
// "": every mode) belongs to mode m.
func inMode(modes string, m engine.Mode) bool {
	return modes == "" || slices.Contains(strings.Split(modes, ","), string(m))
}

// savedIdentity is the part of the identity a checkpoint holds as
// State fields (state:"field"); the other fields are zero.
func savedIdentity(st checkpoint.State) resumeIdentity {
	var id resumeIdentity
	iv, sv := reflect.ValueOf(&id).Elem(), reflect.ValueOf(st)
	for i := range iv.NumField() {
		if f := iv.Type().Field(i); f.Tag.Get("state") == "field" {
			iv.Field(i).Set(sv.FieldByName(f.Name))
		}
	}
	return id
}

// saveSettings writes the run's identity and allowed settings into the
// state a checkpoint saves: the State fields, and every setting as text
// in Settings.
func saveSettings(st *checkpoint.State, id resumeIdentity, allowed resumeAllowed) {
	iv, sv := reflect.ValueOf(id), reflect.ValueOf(st).Elem()
	for i := range iv.NumField() {
		if f := iv.Type().Field(i); f.Tag.Get("state") == "field" {
			sv.FieldByName(f.Name).Set(iv.Field(i))
		}
	}
	st.Settings = map[string]string{}
	for _, s := range append(settingsOf(id), settingsOf(allowed)...) {
		st.Settings[s.flag] = s.text
	}
}

// setting is one flag's value as text.
type setting struct {
	flag, text string
	modes      string // the resume tag: "" for every mode
}

// settingsOf lists the flags of a settings struct (resumeIdentity or
// resumeAllowed) with their values as text.
func settingsOf(v any) []setting {
	rv := reflect.ValueOf(v)
	out := make([]setting, rv.NumField())
	for i := range rv.NumField() {
		f := rv.Type().Field(i)
		out[i] = setting{flag: f.Tag.Get("flag"), text: settingText(rv.Field(i)), modes: f.Tag.Get("resume")}
	}
	return out
}

// settingText writes a value so that two values are equal exactly when
// their texts are: floats in their shortest exact form.
func settingText(v reflect.Value) string {
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64)
	case reflect.Bool:
		return strconv.FormatBool(v.Bool())
	}
	return fmt.Sprint(v.Interface())
}

// savedSettings are the settings a checkpoint was saved with, flag to
// text: its State fields, then its recorded Settings. A flag that is
// missing was not recorded.
func savedSettings(st checkpoint.State) map[string]string {
	m := map[string]string{}
	id := savedIdentity(st)
	t := reflect.TypeOf(id)
	for i, s := range settingsOf(id) {
		if t.Field(i).Tag.Get("state") == "field" {
			m[s.flag] = s.text
		}
	}
	for k, v := range st.Settings {
		m[k] = v
	}
	// Runs before --pack existed had one example per row.
	if _, has := m["pack"]; !has {
		m["pack"] = "false"
	}
	// Runs before --projector had sparse projectors.
	if _, has := m["projector"]; !has && m["mode"] == string(engine.LSP) {
		m["projector"] = string(lsp.KindSparse)
	}
	// Before --fit became opt-in, runs recorded its negation, --no-fit.
	if v, ok := m["no-fit"]; ok {
		if _, has := m["fit"]; !has {
			m["fit"] = strconv.FormatBool(v != "true")
		}
		delete(m, "no-fit")
	}
	// Before --check-at-start, runs recorded its negation, --start-random.
	if v, ok := m["start-random"]; ok {
		if _, has := m["check-at-start"]; !has {
			m["check-at-start"] = strconv.FormatBool(v != "true")
		}
		delete(m, "start-random")
	}
	return m
}

// change is a setting whose value differs between the checkpoint and
// this run.
type change struct{ flag, was, now string }

func (c change) String() string {
	now := c.now
	if c.flag == "d" && now == "0" {
		// --d not given; before lsp.AutoD the default was 512.
		now = "none (0: a quarter of each matrix's shorter side; the default was 512 before)"
	}
	return fmt.Sprintf("--%s: checkpoint has %s, command line has %s", c.flag, c.was, now)
}

// resumeDiff compares the settings a checkpoint was saved with (saved,
// from savedSettings) with this run's: refused are the identity settings
// that differ, allowed the changed settings a resume may change,
// unrecorded the identity flags the checkpoint does not hold. Settings
// of some modes only count when both runs are in the same such mode.
func resumeDiff(saved map[string]string, id resumeIdentity, allowed resumeAllowed) (refused, changed []change, unrecorded []string) {
	for _, s := range settingsOf(id) {
		if s.modes != "" && (saved["mode"] != string(id.Mode) || !inMode(s.modes, id.Mode)) {
			continue // a mode that has no such setting; --mode differs already
		}
		was, ok := saved[s.flag]
		switch {
		case !ok:
			unrecorded = append(unrecorded, "--"+s.flag)
		case was != s.text:
			refused = append(refused, change{s.flag, was, s.text})
		}
	}
	for _, s := range settingsOf(allowed) {
		if was, ok := saved[s.flag]; ok && was != s.text {
			changed = append(changed, change{s.flag, was, s.text})
		}
	}
	return refused, changed, unrecorded
}

// checkResume is nil when a run of c may resume the checkpoint at path
// saved with st, after logging each allowed change (and, for an old
// checkpoint, the settings it cannot check); otherwise an error with one
// line per refused flag.
func checkResume(st checkpoint.State, c Config, fromCheckpoint bool, path string, log *slog.Logger) error {
	refused, changed, unrecorded := resumeDiff(savedSettings(st), c.resumeIdentity(fromCheckpoint), c.resumeAllowed())
	if len(refused) > 0 {
		lines := make([]string, len(refused))
		for i, ch := range refused {
			lines[i] = "  " + ch.String()
		}
		return fmt.Errorf("resume: %s was saved with other settings than this run's; resume with the checkpoint's values, "+
			"or start a new run (--overwrite, or another --out):\n%s", path, strings.Join(lines, "\n"))
	}
	for _, ch := range changed {
		log.Info("resume with a changed setting (allowed)", "flag", "--"+ch.flag, "checkpoint", ch.was, "now", ch.now)
	}
	if len(unrecorded) > 0 {
		log.Warn("resume: the checkpoint predates recording these settings, so a change to them cannot be detected; "+
			"give the values it was trained with", "checkpoint", path, "flags", strings.Join(unrecorded, " "))
	}
	return nil
}
