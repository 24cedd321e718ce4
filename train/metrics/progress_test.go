// Tests for Progress: the non-terminal path (slog lines into a file: how
// many, on which steps, with which attrs), the terminal path with a fake
// clock (in-place redraws, throttling, Log and Done), the moving ETA, and the
// formatting helpers.

package metrics

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeClock advances by step on every call.
type fakeClock struct {
	t    time.Time
	step time.Duration
}

func (c *fakeClock) now() time.Time { c.t = c.t.Add(c.step); return c.t }

// fileProgress is a Progress of total steps drawing to a regular file,
// which is not a terminal, and logging to a buffer; it returns both.
func fileProgress(t *testing.T, total int) (*Progress, *bytes.Buffer, *os.File) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var logs bytes.Buffer
	return NewProgress(f, total, slog.New(slog.NewTextHandler(&logs, nil))), &logs, f
}

// TestProgressLogLoss: a log line holds the loss with four decimals, not
// a float64's 16 digits, and the learning rate with three significant
// digits.
func TestProgressLogLoss(t *testing.T) {
	p, logs, _ := fileProgress(t, 2)
	p.Update(1, 5.460508011005543, 3e-4, 1944)
	if got := attr(logs.String(), "lr"); got != "0.0003" {
		t.Errorf("lr logged as %q, want 0.0003: %s", got, logs.String())
	}
	if got := attr(logs.String(), "loss"); got != "5.4605" {
		t.Errorf("loss logged as %q, want 5.4605: %s", got, logs.String())
	}
}

func TestProgressNonTerminal(t *testing.T) {
	tests := []struct {
		name      string
		total     int
		updates   []int // steps reported
		wantSteps []string
	}{
		{"every 2 of 100", 100, seq(1, 100), nil}, // checked by count below
		{"short run logs every step", 3, seq(1, 3), []string{"1", "2", "3"}},
		{"sparse updates still log", 100, []int{5, 7, 13, 50, 51, 99, 100}, []string{"5", "7", "13", "50", "99", "100"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// A regular file is not a terminal.
			p, logs, f := fileProgress(t, tc.total)
			if p.tty {
				t.Fatal("a regular file was taken for a terminal")
			}
			clk := &fakeClock{t: time.Unix(0, 0), step: time.Second}
			p.now = clk.now
			for _, s := range tc.updates {
				p.Update(s, 1.5, 3e-4, 5100)
			}
			p.Update(tc.updates[len(tc.updates)-1], 1.5, 3e-4, 5100) // a repeat logs nothing
			p.Done()
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			var got []string
			for _, l := range lines {
				got = append(got, attr(l, "step"))
			}
			if tc.wantSteps == nil {
				if len(lines) != 50 || got[0] != "2" || got[49] != "100" {
					t.Fatalf("%d lines, steps %v", len(lines), got)
				}
			} else if strings.Join(got, ",") != strings.Join(tc.wantSteps, ",") {
				t.Fatalf("logged steps %v, want %v", got, tc.wantSteps)
			}
			for _, k := range []string{"loss", "lr", "tok_s", "eta", "total"} {
				if attr(lines[0], k) == "" {
					t.Fatalf("line %q lacks %s", lines[0], k)
				}
			}
			if st, _ := f.Stat(); st.Size() != 0 {
				t.Fatalf("non-terminal path wrote %d bytes to the display file", st.Size())
			}
			if eta := attr(lines[len(lines)-1], "eta"); eta != "0s" {
				t.Fatalf("final eta = %q, want 0s", eta)
			}
		})
	}
}

func TestProgressPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	var logs bytes.Buffer
	p := NewProgress(w, 10, slog.New(slog.NewTextHandler(&logs, nil)))
	if p.tty {
		t.Fatal("a pipe was taken for a terminal")
	}
	p.Update(10, 0.5, 3e-4, 100)
	p.Log("eval", "loss", 0.25)
	if s := logs.String(); !strings.Contains(s, "step=10") || !strings.Contains(s, "msg=eval loss=0.25") {
		t.Fatalf("logs: %s", s)
	}
}

func TestProgressTerminal(t *testing.T) {
	var out, logs bytes.Buffer
	clk := &fakeClock{t: time.Unix(0, 0), step: 30 * time.Millisecond}
	p := &Progress{out: &out, tty: true, total: 600, every: 12,
		logger: slog.New(slog.NewTextHandler(&logs, nil)), now: clk.now}
	p.lastTime = clk.now()
	for s := 1; s <= 20; s++ {
		p.Update(s, 1.234, 3e-4, 5100)
	}
	draws := strings.Count(out.String(), "\r")
	// 20 updates 30 ms apart span 600 ms: the first draw plus about one
	// every 100 ms, far fewer than 20.
	if draws < 4 || draws > 8 {
		t.Fatalf("%d redraws for 20 updates over 600 ms; output %q", draws, out.String())
	}
	if logs.Len() != 0 {
		t.Fatalf("terminal path logged: %s", logs.String())
	}
	out.Reset()
	p.Log("eval", "loss", 1.1)
	if got := out.String(); !strings.HasPrefix(got, "\r\x1b[K") || !strings.Contains(got, "step 20/600") {
		t.Fatalf("Log did not clear and redraw: %q", got)
	}
	if !strings.Contains(logs.String(), "msg=eval") {
		t.Fatalf("Log did not log: %s", logs.String())
	}
	out.Reset()
	p.Update(600, 0.9, 3e-4, 5100) // the last step always draws
	p.Done()
	p.Done()
	got := out.String()
	if !strings.Contains(got, "step 600/600 ["+strings.Repeat("=", barWidth)+"] loss 0.900") || !strings.HasSuffix(got, "\n") ||
		strings.Count(got, "\n") != 1 {
		t.Fatalf("final output %q", got)
	}
}

// The ETA follows recent step times: after a long pause (an eval) it stays
// near the typical step time instead of the whole-run average.
func TestETAIgnoresPause(t *testing.T) {
	clk := &fakeClock{t: time.Unix(0, 0)}
	p := &Progress{total: 1000, every: 1, logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)), now: clk.now}
	p.lastTime = clk.t
	for s := 1; s <= 100; s++ {
		clk.step = time.Second
		if s == 50 {
			clk.step = 10 * time.Minute
		}
		p.Update(s, 1, 3e-4, 1)
	}
	if eta := p.eta(100); eta != 900*time.Second {
		t.Fatalf("eta = %v, want 15m0s (900 steps x 1 s)", eta)
	}
	// Speed changes are picked up within the window.
	for s := 101; s <= 120; s++ {
		clk.step = 2 * time.Second
		p.Update(s, 1, 3e-4, 1)
	}
	if eta := p.eta(120); eta != 880*2*time.Second {
		t.Fatalf("eta = %v after slowdown, want %v", eta, 880*2*time.Second)
	}
}

func TestFormatting(t *testing.T) {
	durs := []struct {
		d    time.Duration
		want string
	}{
		{-1, "?"}, {0, "0s"}, {1400 * time.Millisecond, "1s"}, {59 * time.Second, "59s"},
		{60 * time.Second, "1m00s"}, {92 * time.Second, "1m32s"}, {59*time.Minute + 59*time.Second, "59m59s"},
		{time.Hour, "1h00m"}, {62 * time.Minute, "1h02m"}, {62*time.Minute + 31*time.Second, "1h03m"},
		{100*time.Hour + 5*time.Minute, "100h05m"},
	}
	for _, tc := range durs {
		if got := formatDuration(tc.d); got != tc.want {
			t.Errorf("formatDuration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
	rates := []struct {
		x    float64
		want string
	}{
		{0, "0"}, {950, "950"}, {999.4, "999"}, {999.6, "1.0k"}, {5100, "5.1k"}, {12345, "12.3k"},
		{999_960, "1.0M"}, {2.5e6, "2.5M"}, {3e9, "3.0G"}, {4e12, "4000.0G"}, {nan(), "?"},
	}
	for _, tc := range rates {
		if got := formatRate(tc.x); got != tc.want {
			t.Errorf("formatRate(%v) = %q, want %q", tc.x, got, tc.want)
		}
	}
	bars := []struct {
		step, total, width int
		want               string
	}{
		{0, 10, 10, "          "}, {1, 10, 10, ">         "}, {5, 10, 10, "====>     "},
		{10, 10, 10, "=========="}, {12, 10, 10, "=========="},
	}
	for _, tc := range bars {
		if got := bar(tc.step, tc.total, tc.width); got != tc.want {
			t.Errorf("bar(%d,%d,%d) = %q, want %q", tc.step, tc.total, tc.width, got, tc.want)
		}
	}
	want := "step 120/600 [=>        ] loss 1.234 | lr 0.0003 | 5.1k tok/s | ETA 1m32s"
	if got := statusLine(120, 600, 1.234, 3e-4, 5100, 92*time.Second, 10); got != want {
		t.Errorf("statusLine = %q, want %q", got, want)
	}
	if got := statusLine(7, 0, 2, 1.5e-5, 10, -1, 10); got != "step 7 loss 2.000 | lr 1.5e-05 | 10 tok/s | ETA ?" {
		t.Errorf("statusLine without total = %q", got)
	}
}

func seq(a, b int) []int {
	var s []int
	for i := a; i <= b; i++ {
		s = append(s, i)
	}
	return s
}

// attr extracts key=value from a slog text line.
func attr(line, key string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// TestProgressEvalInETA: the steps' ETA adds SetTail's time (the
// evaluations to come), and a Task's ETA is its own time left at its pace
// so far (the caller's estimate before a unit is done), what follows it,
// and the steps still to go; it logs at its start and end.
func TestProgressEvalInETA(t *testing.T) {
	p, logs, _ := fileProgress(t, 10)
	clk := &fakeClock{t: time.Unix(0, 0), step: 2 * time.Second}
	p.now, p.lastTime = clk.now, clk.t
	p.SetTail(30 * time.Second)
	p.Update(1, 1.5, 3e-4, 100) // 2 s a step, 9 to go: 18 s, and the tail
	if got := attr(logs.String(), "eta"); got != "48s" {
		t.Errorf("step ETA %s, want 48s (18 s of steps and 30 s of evaluations): %s", got, logs.String())
	}
	logs.Reset()
	p.Task("eval: loss", 0, 4, 100*time.Second, 5*time.Second)
	if got := attr(logs.String(), "eta"); got != "2m03s" {
		t.Errorf("task ETA before a batch %s, want 2m03s (100 s estimated, 5 s after, 18 s of steps): %s", got, logs.String())
	}
	logs.Reset()
	for done := 1; done <= 4; done++ { // 2 s a batch
		p.Task("eval: loss", done, 4, 100*time.Second, 5*time.Second)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if last := lines[len(lines)-1]; attr(last, "done") != "4" || attr(last, "eta") != "23s" {
		t.Errorf("the task's last line %q, want done=4 eta=23s (5 s after it, 18 s of steps)", last)
	}
}
