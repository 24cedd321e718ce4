// progress.go: a training progress display. On a terminal it redraws one
// status line in place ("step 120/600 [=====>    ] loss 1.234 | lr 0.0003 |
// 5.1k tok/s | ETA 1m32s"); elsewhere (a pipe, a log file) it emits a slog line every
// ~2% of the run.
//
// Between steps and after them, Task shows work that is not a step (an
// evaluation: "final eval: loss 12/32 [====>   ] | ETA 1m02s").
//
// Limits: the bar assumes the logger writes to the same terminal (Log clears
// and redraws around it); other output written behind Progress's back will
// garble the line until the next redraw. The ETA uses the median per-step time
// of the last few updates, so one eval or checkpoint pause does not inflate it
// and a whole-run average does not drift; it adds the time the caller expects
// the pauses still to come to take (SetTail: the evaluations), not the
// checkpoints'.

package metrics

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

const (
	redrawEvery = 100 * time.Millisecond // at most ~10 redraws a second
	etaWindow   = 16                     // per-step times kept for the ETA
	barWidth    = 24
)

// Progress shows training progress. It is safe for concurrent use.
type Progress struct {
	mu     sync.Mutex
	out    io.Writer
	tty    bool
	width  int // terminal columns, 0 if unknown
	total  int
	every  int // non-terminal: log every this many steps
	logger *slog.Logger
	now    func() time.Time

	nextLog   int // non-terminal: the next step that gets a line
	logged    int // non-terminal: the last step that got one
	lastStep  int
	lastTime  time.Time
	stepTimes []float64 // seconds per step, the last etaWindow updates
	lastDraw  time.Time
	line      string // the status line currently shown (terminal)
	drawn     bool
	done      bool
	tail      time.Duration // expected time of the work after the steps (SetTail)

	// The task Task shows: its label and when its first unit started.
	task      string
	taskStart time.Time
	taskLog   time.Time // non-terminal: when its latest line was logged
}

// NewProgress returns a display for a run of total steps writing to w: a bar
// redrawn in place when w is a terminal, otherwise slog lines through logger
// (slog.Default() when nil).
func NewProgress(w *os.File, total int, logger *slog.Logger) *Progress {
	if logger == nil {
		logger = slog.Default()
	}
	p := &Progress{out: w, total: total, every: max(1, total/50), logger: logger, now: time.Now}
	if w != nil && term.IsTerminal(int(w.Fd())) {
		p.tty = true
		if cols, _, err := term.GetSize(int(w.Fd())); err == nil {
			p.width = cols
		}
	}
	p.lastTime = p.now()
	p.nextLog = p.every
	return p
}

// Update reports that step (1-based, out of total) finished with this loss,
// learning rate and throughput. Steps must not go backwards; a repeated
// step only redraws.
func (p *Progress) Update(step int, loss, lr, tokensPerSec float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if n := step - p.lastStep; n > 0 {
		per := now.Sub(p.lastTime).Seconds() / float64(n)
		p.stepTimes = append(p.stepTimes, per)
		if len(p.stepTimes) > etaWindow {
			p.stepTimes = p.stepTimes[len(p.stepTimes)-etaWindow:]
		}
		p.lastStep, p.lastTime = step, now
	}
	eta := p.eta(step)
	if eta >= 0 {
		eta += p.tail
	}
	last := p.total > 0 && step >= p.total
	if p.tty {
		p.line = statusLine(step, p.total, loss, lr, tokensPerSec, eta, p.barWidth())
		if last || !p.drawn || now.Sub(p.lastDraw) >= redrawEvery {
			p.draw(now)
		}
		return
	}
	// Log on crossing each multiple of every, so callers that skip steps
	// still get lines.
	if (step >= p.nextLog || last) && step > p.logged {
		p.logged = step
		p.nextLog = (step/p.every + 1) * p.every
		// Four decimals, as the eval lines: a float64's 16 digits are noise.
		p.logger.Info("train", "step", step, "total", p.total, "loss", fmt.Sprintf("%.4f", loss),
			"lr", formatLR(lr), "tok_s", math.Round(tokensPerSec), "eta", formatDuration(eta))
	}
}

// SetTail sets the time the work after the remaining steps is expected to
// take (the evaluations still to come), which the ETA adds.
func (p *Progress) SetTail(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tail = max(d, 0)
}

// Task shows done of total units of work that is not a step (an
// evaluation's batches), labelled; its ETA is this work's time left at
// its pace so far (whole, the caller's estimate of all of it, before a
// unit is done), then after (what the caller expects to follow it), then
// the steps still to go. On a terminal it takes the status line (and
// keeps it, ended, when done reaches total after the steps are done);
// elsewhere it logs a line at the start, the end, and every tenth of the
// way at most once a second.
func (p *Progress) Task(label string, done, total int, whole, after time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if label != p.task || done == 0 {
		p.task, p.taskStart = label, now
	}
	left := whole
	if done > 0 {
		left = time.Duration(float64(now.Sub(p.taskStart)) / float64(done) * float64(total-done))
	}
	eta := left + after
	if steps := p.eta(p.lastStep); steps > 0 && !p.done {
		eta += steps
	}
	last := done >= total
	if p.tty {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %d/%d", label, done, total)
		if w := p.barWidth(); w > 0 && total > 0 {
			b.WriteString(" [" + bar(done, total, w) + "]")
		}
		fmt.Fprintf(&b, " | ETA %s", formatDuration(eta))
		p.line = b.String()
		if last || done == 0 || now.Sub(p.lastDraw) >= redrawEvery {
			p.draw(now)
		}
		if last && p.done {
			io.WriteString(p.out, "\n")
			p.line, p.drawn = "", false
		}
		return
	}
	tenth := max(1, (total+9)/10)
	if done == 0 || last || (done%tenth == 0 && now.Sub(p.taskLog) >= time.Second) {
		p.taskLog = now
		p.logger.Info(label, "done", done, "total", total, "eta", formatDuration(eta))
	}
}

// Log logs a message (eval results and the like) without garbling the bar:
// on a terminal the status line is cleared, the message logged, and the line
// redrawn.
func (p *Progress) Log(msg string, args ...any) { p.log(slog.LevelInfo, msg, args...) }

// Warn is Log at the warning level (a skipped step and the like).
func (p *Progress) Warn(msg string, args ...any) { p.log(slog.LevelWarn, msg, args...) }

func (p *Progress) log(level slog.Level, msg string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty && p.drawn {
		io.WriteString(p.out, "\r\x1b[K")
	}
	p.logger.Log(context.Background(), level, msg, args...)
	if p.tty && p.drawn {
		p.draw(p.now())
	}
}

// Done ends the display: on a terminal the final status is drawn and the
// line ended. Calling it again does nothing.
func (p *Progress) Done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return
	}
	p.done = true
	if p.tty && p.line != "" {
		p.draw(p.now())
		io.WriteString(p.out, "\n")
	}
}

// draw writes the current line over the previous one. Write errors are
// ignored: a broken terminal must not stop training.
func (p *Progress) draw(now time.Time) {
	io.WriteString(p.out, "\r"+p.line+"\x1b[K")
	p.drawn, p.lastDraw = true, now
}

// barWidth shrinks the bar on narrow terminals so the line does not wrap
// (a wrapped line cannot be redrawn with \r).
func (p *Progress) barWidth() int {
	if p.width == 0 {
		return barWidth
	}
	return min(barWidth, max(p.width-60, 0))
}

// eta estimates the remaining time from the median recent step time; -1 if
// unknown.
func (p *Progress) eta(step int) time.Duration {
	if len(p.stepTimes) == 0 || p.total <= 0 {
		return -1
	}
	s := slices.Clone(p.stepTimes)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	left := max(p.total-step, 0)
	return time.Duration(med * float64(left) * float64(time.Second))
}

// statusLine formats the terminal line; width 0 leaves the bar out.
func statusLine(step, total int, loss, lr, tps float64, eta time.Duration, width int) string {
	var b strings.Builder
	if total > 0 {
		fmt.Fprintf(&b, "step %d/%d", step, total)
		if width > 0 {
			b.WriteString(" [" + bar(step, total, width) + "]")
		}
	} else {
		fmt.Fprintf(&b, "step %d", step)
	}
	fmt.Fprintf(&b, " loss %.3f | lr %s | %s tok/s | ETA %s", loss, formatLR(lr), formatRate(tps), formatDuration(eta))
	return b.String()
}

// bar draws "=====>    " of the given width for step out of total.
func bar(step, total, width int) string {
	filled := min(max(width*step/total, 0), width)
	if filled == width {
		return strings.Repeat("=", width)
	}
	if filled == 0 {
		return strings.Repeat(" ", width)
	}
	return strings.Repeat("=", filled-1) + ">" + strings.Repeat(" ", width-filled)
}

// formatDuration writes a duration compactly, rounded to seconds below an
// hour ("42s", "1m32s") and to minutes from an hour on ("1h02m"); "?" when
// unknown (negative).
func formatDuration(d time.Duration) string {
	if d < 0 {
		return "?"
	}
	s := int64((d + time.Second/2) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	default:
		m := (s + 30) / 60
		return fmt.Sprintf("%dh%02dm", m/60, m%60)
	}
}

// formatLR writes a learning rate with three significant digits, as the
// schedule's warmup and decay change it ("0.0003", "1.5e-05"): enough to
// see where in the schedule the run is, not the float64's noise.
func formatLR(lr float64) string { return strconv.FormatFloat(lr, 'g', 3, 64) }

// formatRate writes a rate with one decimal and an SI suffix ("950",
// "5.1k", "12.3M").
func formatRate(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "?"
	}
	if math.Abs(x) < 999.5 {
		return fmt.Sprintf("%.0f", x)
	}
	u := 0
	for x /= 1000; math.Abs(x) >= 999.95 && u < 2; u++ {
		x /= 1000
	}
	return fmt.Sprintf("%.1f%s", x, "kMG"[u:u+1])
}
