// The resume identity: the settings a resumed run must share with the run
// that saved its checkpoint, compared field by field, so that a resume
// with another value stops with an error naming each differing flag
// instead of silently training on something else.
//
// Limits: the identity holds today's checked settings only; other settings
// that change the computation (the learning rate and its schedule, Adam's
// hyperparameters, clipping, the gradient dtype, lsp's fit settings) may
// still differ on resume. resume_test.go lists them, and fails on a new
// Config field that is in neither list.

package train

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/engine"
)

// resumeIdentity is what decides the data order and the math of the state
// a checkpoint holds. Each field is named as the Config field (and the
// checkpoint.State field) it comes from; its tag is its flag, and
// resume:"lsp" marks a field that lsp mode alone has (zero in the other
// modes, compared only when both runs are in lsp mode).
type resumeIdentity struct {
	DType        backend.DType      `flag:"dtype"`
	Batch        int                `flag:"batch"`
	SeqLen       int                `flag:"seq-len"`
	GradAccum    int                `flag:"grad-accum"`
	Data         string             `flag:"data"`
	Seed         uint64             `flag:"seed"`
	EvalFraction float64            `flag:"eval-fraction"`
	Truncate     bool               `flag:"truncate"`
	Mode         engine.Mode        `flag:"mode"`
	DenseParams  engine.DenseParams `flag:"dense-params" resume:"lsp"` // resolved: never "" in lsp mode
	D            int                `flag:"d" resume:"lsp"`
	R            int                `flag:"r" resume:"lsp"`
}

// resumeIdentity is the identity of a run of c; fromCheckpoint resolves
// the default of --dense-params.
func (c Config) resumeIdentity(fromCheckpoint bool) resumeIdentity {
	id := resumeIdentity{DType: c.DType, Batch: c.Batch, SeqLen: c.SeqLen, GradAccum: c.GradAccum, Data: c.Data,
		Seed: c.Seed, EvalFraction: c.EvalFraction, Truncate: c.Truncate, Mode: c.Mode}
	if c.Mode == engine.LSP {
		id.DenseParams, id.D, id.R = c.denseParams(fromCheckpoint), c.D, c.R
	}
	return id
}

// savedIdentity is the identity a checkpoint was saved with.
func savedIdentity(st checkpoint.State) resumeIdentity {
	return resumeIdentity{DType: st.DType, Batch: st.Batch, SeqLen: st.SeqLen, GradAccum: st.GradAccum, Data: st.Data,
		Seed: st.Seed, EvalFraction: st.EvalFraction, Truncate: st.Truncate, Mode: st.Mode,
		DenseParams: st.DenseParams, D: st.D, R: st.R}
}

// into writes the identity into the state a checkpoint saves.
func (id resumeIdentity) into(st *checkpoint.State) {
	st.DType, st.Batch, st.SeqLen, st.GradAccum, st.Data = id.DType, id.Batch, id.SeqLen, id.GradAccum, id.Data
	st.Seed, st.EvalFraction, st.Truncate, st.Mode = id.Seed, id.EvalFraction, id.Truncate, id.Mode
	st.DenseParams, st.D, st.R = id.DenseParams, id.D, id.R
}

// mismatch is nil when a run with identity now may resume the checkpoint
// at path saved with saved; otherwise an error naming every differing
// flag with its saved value and this run's.
func (saved resumeIdentity) mismatch(now resumeIdentity, path string) error {
	sv, nv := reflect.ValueOf(saved), reflect.ValueOf(now)
	bothLSP := saved.Mode == engine.LSP && now.Mode == engine.LSP
	var was, has []string
	for i := range sv.NumField() {
		f := sv.Type().Field(i)
		if f.Tag.Get("resume") == "lsp" && !bothLSP {
			continue // a mode that has no such setting; --mode differs already
		}
		if sv.Field(i).Equal(nv.Field(i)) {
			continue
		}
		was = append(was, flagText(f.Tag.Get("flag"), sv.Field(i).Interface()))
		has = append(has, flagText(f.Tag.Get("flag"), nv.Field(i).Interface()))
	}
	if len(was) == 0 {
		return nil
	}
	return fmt.Errorf("resume: %s was saved with %s; this run has %s; resume with the same values",
		path, strings.Join(was, " "), strings.Join(has, " "))
}

// flagText writes a setting as it is given on the command line.
func flagText(flag string, v any) string {
	if b, ok := v.(bool); ok {
		return fmt.Sprintf("--%s=%v", flag, b)
	}
	return fmt.Sprintf("--%s %v", flag, v)
}
