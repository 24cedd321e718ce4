// Tests for the JSON-lines Writer and ReadFile: round trip, resume keeping
// only steps <= resumeStep (and unknown fields), crash-cut last lines, bad
// lines, and time continuing across a resume.

package metrics

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/faults"
)

func steps(recs []Record) []int {
	var s []int
	for _, r := range recs {
		s = append(s, r.Step)
	}
	return s
}

func writeAll(t *testing.T, path string, resume int, recs ...Record) {
	t.Helper()
	w, err := Create(path, resume)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// roundTrip writes recs to a new file at path, fails unless they read back
// as they were, and returns the file.
func roundTrip(t *testing.T, path string, recs ...Record) []byte {
	t.Helper()
	writeAll(t, path, -1, recs...)
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, recs) {
		t.Fatalf("got %+v, want %+v", got, recs)
	}
	b, _ := os.ReadFile(path)
	return b
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	in := []Record{
		{Step: 1, Time: 0.5, TrainLoss: F(2.5), LR: F(1e-3), TokensPerSec: F(5100), GradNorm: F(0.7)},
		{Step: 2, Time: 1.5, EvalLoss: F(2.25), ExactMatch: F(0.125)},
		{Step: 2, Time: 1.6, Event: "checkpoint"},
	}
	b := roundTrip(t, path, in...)
	if lines := strings.Split(strings.TrimSpace(string(b)), "\n"); len(lines) != 3 ||
		lines[1] != `{"step":2,"time_s":1.5,"eval_loss":2.25,"eval_exact_match":0.125}` {
		t.Fatalf("file:\n%s", b)
	}
	// A new run (resumeStep < 0) truncates.
	writeAll(t, path, -1, Record{Step: 1, Time: 1})
	if got, _ := ReadFile(path); len(got) != 1 {
		t.Fatalf("after truncating create: %d records", len(got))
	}
}

func TestResume(t *testing.T) {
	tests := []struct {
		name   string
		resume int
		want   []int
	}{
		{"middle", 20, []int{10, 20, 20, 21}},
		{"before all", 5, []int{21}},
		{"after all", 100, []int{10, 20, 20, 30, 40, 21}},
		{"zero", 0, []int{21}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "metrics.jsonl")
			writeAll(t, path, -1,
				Record{Step: 10, Time: 1, TrainLoss: F(3)},
				Record{Step: 20, Time: 2, TrainLoss: F(2)},
				Record{Step: 20, Time: 2.5, EvalLoss: F(2.1)},
				Record{Step: 30, Time: 3, TrainLoss: F(1.5)},
				Record{Step: 40, Time: 4, TrainLoss: F(1.2)})
			writeAll(t, path, tc.resume, Record{Step: 21, Time: 9, TrainLoss: F(1.9)})
			got, err := ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if s := steps(got); !reflect.DeepEqual(s, tc.want) {
				t.Fatalf("steps = %v, want %v", s, tc.want)
			}
		})
	}
}

func TestResumeMissingFileAndUnknownFields(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "metrics.jsonl")
	writeAll(t, path, 50, Record{Step: 51, Time: 1})
	if got, err := ReadFile(path); err != nil || len(got) != 1 {
		t.Fatalf("resume on missing file: %v %v", got, err)
	}
	// Lines are kept byte for byte, including fields this version lacks,
	// and a line cut short by a crash is dropped.
	old := `{"step":1,"time_s":1,"future_field":[1,2]}` + "\n" + `{"step":2,"time_s":2}` + "\n" + `{"step":3,"ti`
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	writeAll(t, path, 2, Record{Step: 3, Time: 3})
	b, _ := os.ReadFile(path)
	want := `{"step":1,"time_s":1,"future_field":[1,2]}` + "\n" + `{"step":2,"time_s":2}` + "\n" + `{"step":3,"time_s":3}` + "\n"
	if string(b) != want {
		t.Fatalf("file = %q, want %q", b, want)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("directory holds %v", ents)
	}
}

func TestResumeTimeContinues(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	writeAll(t, path, -1, Record{Step: 1, Time: 100}, Record{Step: 2, Time: 200})
	w, err := Create(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	base := w.start
	w.now = func() time.Time { return base.Add(5 * time.Second) }
	if err := w.Write(Record{Step: 2, TrainLoss: F(1)}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	got, _ := ReadFile(path)
	if len(got) != 2 || got[1].Time != 105 {
		t.Fatalf("records %+v: want time 100+5 on the resumed step", got)
	}
}

func TestReadErrors(t *testing.T) {
	tests := []struct {
		name, content, want string
	}{
		{"bad middle line", "{\"step\":1}\nnot json\n{\"step\":3}\n", ":2:"},
		{"bad terminated last line", "{\"step\":1}\n{\"step\":\n", ":2:"},
		{"wrong type", "{\"step\":\"one\"}\n", ":1:"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.jsonl")
			os.WriteFile(path, []byte(tc.content), 0o644)
			_, err := ReadFile(path)
			if err == nil || !strings.Contains(err.Error(), path+tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, path+tc.want)
			}
			// Resuming from a corrupt file fails too, leaving it as it was.
			if _, err := Create(path, 10); err == nil {
				t.Fatal("Create on a corrupt file succeeded")
			}
			if b, _ := os.ReadFile(path); string(b) != tc.content {
				t.Fatalf("corrupt file was modified: %q", b)
			}
		})
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Fatal("ReadFile of a missing file succeeded")
	}
}

func TestWriteErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.jsonl")
	w, err := Create(path, -1)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Record{Step: 1, TrainLoss: F(nan())}); err == nil || !strings.Contains(err.Error(), "step 1") {
		t.Fatalf("NaN loss: err = %v", err)
	}
	w.Close()
	if err := w.Write(Record{Step: 2}); err == nil {
		t.Fatal("Write after Close succeeded")
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestFullDiskCutsPartialLine: a record whose line is half written when
// the disk fills is cut off again, so the file stays whole lines and a
// later record (after space is freed) does not follow a broken one; a
// resume from a cut line written by a crash drops it.
func TestFullDiskCutsPartialLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	w, err := Create(path, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Write(Record{Step: 1, TrainLoss: F(1)}); err != nil {
		t.Fatal(err)
	}
	disarm, err := faults.Arm(faults.Fail, "metrics-partial@metrics.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	err = w.Write(Record{Step: 2, TrainLoss: F(2)})
	disarm()
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v, want ENOSPC naming %s", err, path)
	}
	if err := w.Write(Record{Step: 2, TrainLoss: F(2)}); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadFile(path)
	if err != nil || len(recs) != 2 || recs[1].Step != 2 {
		t.Fatalf("records %+v, %v; want steps 1 and 2", recs, err)
	}

	// A crash's cut line at the end: dropped on resume, appends follow.
	raw, _ := os.ReadFile(path)
	if err := os.WriteFile(path, append(raw, `{"step":3,"train_lo`...), 0o644); err != nil {
		t.Fatal(err)
	}
	w2, err := Create(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := w2.Write(Record{Step: 3, TrainLoss: F(3)}); err != nil {
		t.Fatal(err)
	}
	w2.Close()
	if recs, err := ReadFile(path); err != nil || len(recs) != 3 || recs[2].Step != 3 {
		t.Fatalf("after resume: %+v, %v", recs, err)
	}
}

// TestSkippedStep: a skipped attempt round-trips with its non-finite loss
// as text, and a resume from a checkpoint before the skipped step drops
// it (the resumed run reads the batch again) while a resume from the step
// it was attempted at, which the checkpoint includes, keeps it.
func TestSkippedStep(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	in := []Record{
		{Step: 1, Time: 0.5, TrainLoss: F(2.5)},
		{Step: 2, Time: 0.9, LR: F(1e-3), Event: SkippedStepEvent, Skipped: &SkippedStep{Loss: "NaN", InARow: 1}},
		{Step: 2, Time: 1.2, LR: F(1e-3), Event: SkippedStepEvent, Skipped: &SkippedStep{Loss: "+Inf", InARow: 2}},
		{Step: 2, Time: 1.5, TrainLoss: F(2.25)},
	}
	b := roundTrip(t, path, in...)
	if !strings.Contains(string(b), `"event":"skipped-step","skipped":{"loss":"NaN","in_a_row":1}`) {
		t.Errorf("no skipped record as documented in\n%s", b)
	}
	for _, tc := range []struct {
		resume int
		want   []int
	}{{1, []int{1}}, {2, []int{1, 2, 2, 2}}} {
		writeAll(t, path, -1, in...)
		writeAll(t, path, tc.resume)
		got, err := ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if s := steps(got); !reflect.DeepEqual(s, tc.want) {
			t.Errorf("resume at %d kept steps %v, want %v", tc.resume, s, tc.want)
		}
	}
}
