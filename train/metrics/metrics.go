// Package metrics records training metrics as JSON lines (one Record per
// line in metrics.jsonl), plots loss curves to PNG, and shows progress on a
// terminal or as log lines.
//
// Limits of metrics.jsonl: a Writer is meant for one process; records are written
// with one write call each, so a crash can cut at most the last line short,
// and readers drop such a cut line (a resumed run rewrites the file without
// it). A write that fails part way (a full disk) is cut back off the file
// at once, so no later record follows a broken line. Lines are kept byte
// for byte on resume, so fields this version does not know survive.
package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/faults"
)

// Record is one line of metrics.jsonl. Optional values are pointers so that
// "not measured at this step" (omitted) differs from zero.
type Record struct {
	Step         int      `json:"step"`
	Time         float64  `json:"time_s"` // seconds since the run started, summed over resumes
	TrainLoss    *float64 `json:"train_loss,omitempty"`
	EvalLoss     *float64 `json:"eval_loss,omitempty"`
	Perplexity   *float64 `json:"eval_perplexity,omitempty"` // exp(eval_loss)
	ExactMatch   *float64 `json:"eval_exact_match,omitempty"`
	TokensPerSec *float64 `json:"tokens_per_s,omitempty"`
	LR           *float64 `json:"lr,omitempty"`
	GradNorm     *float64 `json:"grad_norm,omitempty"`
	// CommBytes is the payload this rank sent to the other ranks of a
	// data-parallel run during the step (rank 0's; absent alone).
	CommBytes *float64 `json:"comm_bytes,omitempty"`
	Event     string   `json:"event,omitempty"` // e.g. "resume", "checkpoint", "projector-check", "skipped-step"
	// Projector is one matrix's projector check in lsp mode.
	Projector *ProjectorCheck `json:"projector,omitempty"`
	// Skipped is an attempt at step Step whose loss was not finite and
	// which --on-nonfinite skip skipped.
	Skipped *SkippedStep `json:"skipped,omitempty"`
	// Profile is one profiled step's breakdown (lsp-train profile).
	Profile *Profile `json:"profile,omitempty"`
}

// SkippedStepEvent is the Event of a skipped step's record.
const SkippedStepEvent = "skipped-step"

// SkippedStep is an attempt at a step that was skipped because its loss
// was not finite: nothing was updated and the step number did not
// advance, so the next record of the same step is the attempt with the
// next batch. A run resumed from a checkpoint before the skip reads the
// same batch again and records the skip again, at the same step.
type SkippedStep struct {
	Loss   string `json:"loss"`     // the step's mean loss as Go prints it: NaN, +Inf or -Inf (JSON has no such numbers)
	InARow int    `json:"in_a_row"` // the attempts at this step skipped so far, this one included
}

// ProjectorCheckEvent is the Event of a projector check's record.
const ProjectorCheckEvent = "projector-check"

// ProjectorCheck is one matrix's projector check: the bias ratio
// ||P P^T G Q Q^T - G|| / ||G|| before and after the fit, the fit's Adam
// steps, whether the projectors were redrawn and fitted, whether the ratio
// reached alpha, the subspace change of the moment carry-over, whether
// the matrix's learning rate is re-warmed, and the fit's wall time.
type ProjectorCheck struct {
	Matrix      string  `json:"matrix"`
	RatioBefore float64 `json:"ratio_before"`
	RatioAfter  float64 `json:"ratio_after"`
	Iters       int     `json:"iters"`
	Resampled   bool    `json:"resampled"`
	Reached     bool    `json:"reached"`
	Change      float64 `json:"change"`
	Rewarm      bool    `json:"rewarm"`
	Seconds     float64 `json:"seconds"`
	// Rejected: new projectors were made and the held-out micro-batches
	// kept the old ones; the captures are the shares of the held-out
	// gradient in the subspaces of the old and the kept projectors.
	Rejected      bool    `json:"rejected,omitempty"`
	CaptureBefore float64 `json:"capture_before,omitempty"`
	CaptureAfter  float64 `json:"capture_after,omitempty"`
}

// F returns a pointer to x, for the optional fields of Record.
func F(x float64) *float64 { return &x }

// Writer appends Records to a JSON-lines file. It is safe for concurrent use.
type Writer struct {
	mu     sync.Mutex
	path   string
	f      *os.File
	size   int64 // the file's length after the last complete record
	start  time.Time
	offset float64 // time_s of the last record kept on resume
	now    func() time.Time
	// evalAt is the latest step of an eval record kept on resume (-1:
	// none).
	evalAt int
	tb     *TBWriter // the same records for TensorBoard (nil: none)
}

// TensorBoard makes w also write its records into a TensorBoard events
// file of this process in dir (CreateTB; resumeStep as for Create).
func (w *Writer) TensorBoard(dir string, resumeStep int) error {
	tb, err := CreateTB(dir, resumeStep)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tb = tb
	return nil
}

// Create opens path for writing metrics. With resumeStep < 0 it starts a new
// file (truncating any old one). With resumeStep >= 0 it keeps the existing
// lines whose step is <= resumeStep, rewrites the file atomically with only
// those, and appends after them, so a run resumed from a checkpoint at
// resumeStep has no duplicated or orphaned steps; a missing file is created.
// Projector checks at resumeStep are not kept: a run checks the projectors
// before the step after its checkpoint (recording them at the checkpoint's
// step), so a resumed run checks them again. Times continue from the last
// kept record.
func Create(path string, resumeStep int) (*Writer, error) {
	w := &Writer{path: path, now: time.Now, evalAt: -1}
	if resumeStep < 0 {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		w.f, w.start = f, w.now()
		return w, nil
	}
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	recs, lines, err := parse(path, data)
	if err != nil {
		return nil, err
	}
	var keep [][]byte
	for i, r := range recs {
		if r.Step < resumeStep || r.Step == resumeStep && r.Event != ProjectorCheckEvent {
			keep = append(keep, lines[i])
			w.offset = max(w.offset, r.Time)
			if r.EvalLoss != nil || r.ExactMatch != nil {
				w.evalAt = max(w.evalAt, r.Step)
			}
		}
	}
	err = atomicfile.WriteFile(path, 0o644, func(out io.Writer) error {
		for _, l := range keep {
			if _, err := out.Write(l); err != nil {
				return err
			}
			if _, err := out.Write([]byte{'\n'}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("metrics: rewrite for resume at step %d: %w", resumeStep, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("metrics: %w", err)
	}
	w.f, w.size, w.start = f, st.Size(), w.now()
	return w, nil
}

// LastEval is the step of the latest eval record the file held when a
// resume opened it, -1 when it held none (or the run started afresh).
func (w *Writer) LastEval() int { return w.evalAt }

// Write appends r as one line and hands it to the OS at once (no buffering),
// so the file is current even if the process dies. A zero r.Time is filled in
// with the seconds since the run started (continuing across resumes).
func (w *Writer) Write(r Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return fmt.Errorf("metrics: write %s: writer is closed", w.path)
	}
	if r.Time == 0 {
		r.Time = w.offset + w.now().Sub(w.start).Seconds()
	}
	b, err := json.Marshal(r)
	if err != nil { // NaN or Inf in a field: JSON cannot hold them
		return fmt.Errorf("metrics: write %s step %d: %w", w.path, r.Step, err)
	}
	b = append(b, '\n')
	if err := w.append(b); err != nil {
		// Cut the partial line off, so the file stays valid JSON lines and
		// a later record never follows a broken one.
		if terr := w.f.Truncate(w.size); terr != nil {
			err = errors.Join(err, fmt.Errorf("cutting the partial line off: %w", terr))
		}
		return fmt.Errorf("metrics: write %s: %w", w.path, err)
	}
	w.size += int64(len(b))
	if w.tb != nil {
		return w.tb.Write(r)
	}
	return nil
}

// append writes line in one call; while a fault is armed (tests) it
// writes it in two halves with the metrics-partial point between them.
func (w *Writer) append(line []byte) error {
	base := filepath.Base(w.path)
	if faults.Armed() {
		if _, err := w.f.Write(line[:len(line)/2]); err != nil {
			return err
		}
		if err := faults.Point("metrics-partial", base); err != nil {
			return err
		}
		line = line[len(line)/2:]
	}
	if _, err := w.f.Write(line); err != nil {
		return err
	}
	return faults.Point("metrics-appended", base)
}

// Close closes the file. Closing twice is not an error.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	if w.tb != nil {
		err = errors.Join(err, w.tb.Close())
		w.tb = nil
	}
	if err != nil {
		return fmt.Errorf("metrics: close %s: %w", w.path, err)
	}
	return nil
}

// ReadFile reads all records of a metrics file in file order. A last line cut
// short by a crash (no newline, not valid JSON) is dropped; any other bad line
// is an error naming the file and line.
func ReadFile(path string) ([]Record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	recs, _, err := parse(path, data)
	return recs, err
}

// parse decodes JSON lines, returning each record with its raw line (without
// the newline). Blank lines are skipped.
func parse(path string, data []byte) ([]Record, [][]byte, error) {
	var recs []Record
	var lines [][]byte
	for n := 1; len(data) > 0; n++ {
		line, rest, found := bytes.Cut(data, []byte{'\n'})
		data = rest
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r Record
		if err := json.Unmarshal(line, &r); err != nil {
			if !found { // the final, unterminated line: an interrupted write
				break
			}
			return nil, nil, fmt.Errorf("metrics: %s:%d: %w", path, n, err)
		}
		recs = append(recs, r)
		lines = append(lines, line)
	}
	return recs, lines, nil
}
