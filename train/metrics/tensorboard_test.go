// Tests of the TensorBoard events files: what the Writer writes reads
// back (framing, CRCs, the Event fields), a cut or damaged file, and the
// fixture written by tensorboard's own EventFileWriter
// (scripts/fixtures/tensorboard_check.py), which ReadTB decodes and our
// encoder reproduces byte for byte apart from the wall time.

package metrics

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestTensorBoardWriter: a resumed run's Writer writes metrics.jsonl and an
// events file: the file version, a session start at the step after the
// checkpoint, then one Event per record with values, none for a record
// without.
func TestTensorBoardWriter(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(filepath.Join(dir, "metrics.jsonl"), 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.TensorBoard(filepath.Join(dir, "tb"), 3); err != nil {
		t.Fatal(err)
	}
	recs := []Record{
		{Step: 4, TrainLoss: F(2.5), LR: F(3e-4), GradNorm: F(1.5), TokensPerSec: F(5100)},
		{Step: 4, Event: ProjectorCheckEvent, Projector: &ProjectorCheck{Matrix: "attn"}},
		{Step: 5, EvalLoss: F(2.25), ExactMatch: F(0.5)},
	}
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "tb", "events.out.tfevents.*"))
	if len(files) != 1 {
		t.Fatalf("events files %v, want one", files)
	}
	evs, err := ReadTB(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 4 {
		t.Fatalf("%d events, want 4: %+v", len(evs), evs)
	}
	if evs[0].FileVersion != FileVersion || evs[0].WallTime <= 0 {
		t.Errorf("first event %+v, want the file version %q with a wall time", evs[0], FileVersion)
	}
	if !evs[1].SessionStart || evs[1].Step != 4 {
		t.Errorf("second event %+v, want a session start at step 4", evs[1])
	}
	want := []Scalar{{"train/loss", 2.5}, {"train/learning_rate", 3e-4}, {"train/grad_norm", 1.5}, {"train/tokens_per_s", 5100}}
	if evs[2].Step != 4 || !slices.Equal(evs[2].Scalars, want) || evs[2].WallTime < evs[0].WallTime {
		t.Errorf("third event %+v, want step 4 with %v", evs[2], want)
	}
	want = []Scalar{{"eval/loss", 2.25}, {"eval/exact_match", 0.5}}
	if evs[3].Step != 5 || !slices.Equal(evs[3].Scalars, want) {
		t.Errorf("fourth event %+v, want step 5 with %v", evs[3], want)
	}

	// A record cut short ends the list; a flipped byte is an error.
	raw, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut")
	os.WriteFile(cut, raw[:len(raw)-3], 0o644)
	if got, err := ReadTB(cut); err != nil || len(got) != 3 {
		t.Errorf("a cut file: %d events, %v; want 3, no error", len(got), err)
	}
	for _, at := range []int{9, 20, len(raw) - 2} {
		bad := bytes.Clone(raw)
		bad[at] ^= 1
		os.WriteFile(cut, bad, 0o644)
		if _, err := ReadTB(cut); err == nil {
			t.Errorf("a flipped byte at %d is not found", at)
		}
	}
}

// fixture is what scripts/fixtures/tensorboard_check.py's FIXTURE wrote
// into testdata/tensorboard/events.out.tfevents.fixture through
// tensorboard's EventFileWriter (tensorboard 2.21.0), before a SessionLog
// START at step 301.
var fixture = []struct {
	step    int64
	scalars []Scalar
}{
	{1, []Scalar{{"train/loss", 5.5}, {"train/learning_rate", 0.0003}, {"train/grad_norm", 1.25}, {"train/tokens_per_s", 3150}}},
	{2, []Scalar{{"train/loss", 4.75}, {"train/learning_rate", 0.00015}}},
	{2, []Scalar{{"eval/loss", 4.5}, {"eval/exact_match", 0}}},
	{300, []Scalar{{"train/loss", float32(math.Copysign(0, -1))}, {"train/learning_rate", 1e-30}}}, // -0: the sign bit survives
}

// TestTensorBoardFixture: ReadTB decodes tensorboard's own file, and our
// encoding of the same events is the same bytes, framing included, but
// for the wall time (which the fixture's events carry and ours take).
func TestTensorBoardFixture(t *testing.T) {
	path := filepath.Join("testdata", "tensorboard", "events.out.tfevents.fixture")
	evs, err := ReadTB(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2+len(fixture) {
		t.Fatalf("%d events in %s, want %d", len(evs), path, 2+len(fixture))
	}
	if evs[0].FileVersion != FileVersion {
		t.Errorf("the fixture's first event has file version %q, want %q", evs[0].FileVersion, FileVersion)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range fixture {
		ev := evs[i+1]
		if ev.Step != f.step || !slices.Equal(ev.Scalars, f.scalars) || ev.WallTime != 1700000000.25+float64(i) {
			t.Errorf("fixture event %d: %+v, want step %d, wall time %v, %v", i, ev, f.step, 1700000000.25+float64(i), f.scalars)
		}
		ours := AppendScalars(nil, ev.WallTime, f.step, f.scalars)
		if !bytes.Equal(ours, ev.Data) {
			t.Errorf("fixture event %d:\nours   %x\ntheirs %x", i, ours, ev.Data)
		}
		if framed := AppendTFRecord(nil, ours); !bytes.Contains(raw, framed) {
			t.Errorf("fixture event %d: our framed record %x is not in the file", i, framed)
		}
	}
	last := evs[len(evs)-1]
	if ours := AppendSessionStart(nil, 1700000000.25+float64(len(fixture)), 301); !last.SessionStart || !bytes.Equal(ours, last.Data) {
		t.Errorf("the fixture's session start %+v:\nours   %x\ntheirs %x", last, ours, last.Data)
	}
}
