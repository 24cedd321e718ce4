// batch.go: next-token batches. A row holds one example: inputs are its
// tokens but the last, targets the tokens one ahead, -1 where no loss is
// taken (prompt positions, a conversation's turns other than the
// assistant's, and padding). The Loader serves the training
// examples in a shuffled order drawn afresh each epoch from (seed, epoch), so
// a Position of two integers resumes the stream exactly. By default a row
// holds one example; a packing Loader (SetPack, --pack) puts as many
// consecutive examples of that order in a row as fit, each at positions
// restarting from 0 (Batch.Positions). A Loader is not safe for concurrent
// use.

package data

import "fmt"

// Batch holds B rows of T inputs and targets, row-major (row r is
// [r*T, (r+1)*T)). Targets[i] = -1 where no loss is taken (prompt tokens,
// padding). Inputs past an example's end repeat its final token, which is
// the EOS for every instruction example that was not truncated; causal
// attention and the -1 targets make that value irrelevant to the loss.
// NumTargets counts the targets that are not -1.
//
// Positions, nil for rows of one example, is set for packed rows: each
// token's position within its example (backend.Positions). An example of
// L tokens takes L-1 places of a packed row, its inputs and targets
// exactly as in a row of its own, so its last input predicts its own last
// token and no target crosses into the next example. The places after a
// row's last example are padding (inputs its final token, targets -1), a
// document of their own from position 0.
type Batch struct {
	B, T            int
	Inputs, Targets []int32
	Positions       []int32
	NumTargets      int
}

// resize sets the shape, reusing the slices when they are large enough.
func (b *Batch) resize(B, T int) {
	b.B, b.T = B, T
	if cap(b.Inputs) < B*T {
		b.Inputs = make([]int32, B*T)
	}
	if cap(b.Targets) < B*T {
		b.Targets = make([]int32, B*T)
	}
	b.Inputs, b.Targets = b.Inputs[:B*T], b.Targets[:B*T]
	b.Positions = nil
	b.NumTargets = 0
}

// resizePacked is resize with Positions of B*T (reused when large enough).
func (b *Batch) resizePacked(B, T int) {
	pos := b.Positions
	b.resize(B, T)
	if cap(pos) < B*T {
		pos = make([]int32, B*T)
	}
	b.Positions = pos[:B*T]
}

// fillRow writes one example into a row of T inputs and targets and returns
// the number of targets. An example longer than T+1 is cut to T+1.
func fillRow(in, tg []int32, ex Example, pad int32) int {
	T := len(in)
	t := ex.Tokens
	if len(t) > T+1 {
		t = t[:T+1]
	}
	if len(t) > 0 {
		pad = t[len(t)-1]
	}
	n, s := 0, 0
	for i := range T {
		if i+1 < len(t) {
			in[i] = t[i]
			// Position i predicts t[i+1]: a target once i+1 reaches the
			// response (for plain text PromptLen is 0: always), and with
			// Spans only inside one of them.
			target := i+1 >= ex.PromptLen
			if ex.Spans != nil {
				for s < len(ex.Spans) && ex.Spans[s].End <= i+1 {
					s++
				}
				target = s < len(ex.Spans) && i+1 >= ex.Spans[s].Start
			}
			if target {
				tg[i] = t[i+1]
				n++
			} else {
				tg[i] = -1
			}
		} else {
			in[i], tg[i] = pad, -1
		}
	}
	return n
}

// Position is where a Loader stands: the next example is number Index of
// epoch Epoch's shuffled order. Together with the seed it resumes exactly.
type Position struct {
	Epoch int `json:"epoch"`
	Index int `json:"index"`
}

// Loader iterates over training examples in a seeded shuffled order, epoch
// after epoch; a batch can span an epoch boundary.
type Loader struct {
	ex        []Example
	b, t      int
	seed      uint64
	pos       Position
	perm      []int // the order of epoch permEpoch
	permEpoch int
	pack      bool
}

// SetPack makes Next pack consecutive examples into each row (--pack;
// Batch.Positions). The order of examples is the same either way.
func (l *Loader) SetPack(on bool) { l.pack = on }

// NewLoader checks that every example fits a row (2 <= len(Tokens) <= T+1,
// PromptLen < len(Tokens), so it has a target; Spans, when set, in order,
// each non-empty, inside the tokens after the first, the first starting at
// PromptLen) and returns a Loader at epoch 0, index 0. The examples are not copied: do not modify them.
func NewLoader(examples []Example, B, T int, seed uint64) (*Loader, error) {
	if B < 1 || T < 1 {
		return nil, fmt.Errorf("data: loader shape B=%d T=%d, want both at least 1", B, T)
	}
	if len(examples) == 0 {
		return nil, fmt.Errorf("data: loader has no examples")
	}
	for i, ex := range examples {
		L := len(ex.Tokens)
		switch {
		case L > T+1:
			return nil, fmt.Errorf("data: example %d has %d tokens, more than T+1 = %d", i, L, T+1)
		case L < 2:
			return nil, fmt.Errorf("data: example %d has %d token(s); it needs 2 to have a target", i, L)
		case ex.PromptLen < 0 || ex.PromptLen >= L:
			return nil, fmt.Errorf("data: example %d has prompt length %d of %d tokens; no target is left", i, ex.PromptLen, L)
		}
		if err := checkSpans(ex); err != nil {
			return nil, fmt.Errorf("data: example %d: %w", i, err)
		}
	}
	l := &Loader{ex: examples, b: B, t: T, seed: seed, permEpoch: -1}
	return l, nil
}

// checkSpans checks an example's Spans (nil passes).
func checkSpans(ex Example) error {
	if ex.Spans == nil {
		return nil
	}
	if len(ex.Spans) == 0 || ex.Spans[0].Start != ex.PromptLen {
		return fmt.Errorf("target spans %v do not start at the prompt length %d", ex.Spans, ex.PromptLen)
	}
	prev := 1 // token 0 is never a target: nothing predicts it
	for _, s := range ex.Spans {
		if s.Start < prev || s.End <= s.Start || s.End > len(ex.Tokens) {
			return fmt.Errorf("target spans %v are not in order, non-empty and within tokens 1 to %d", ex.Spans, len(ex.Tokens))
		}
		prev = s.End
	}
	return nil
}

// order returns the shuffled order of an epoch, computing it on change.
func (l *Loader) order(epoch int) []int {
	if l.permEpoch != epoch {
		l.perm = newRNG(l.seed, streamOf("loader")^uint64(epoch)).perm(len(l.ex))
		l.permEpoch = epoch
	}
	return l.perm
}

// Next fills b with the next B examples, or with packing as many as fill B
// rows (allocating its slices only when they are too small), and advances
// the position.
func (l *Loader) Next(b *Batch) {
	if l.pack {
		l.nextPacked(b)
		return
	}
	b.resize(l.b, l.t)
	for r := range l.b {
		ex := l.ex[l.order(l.pos.Epoch)[l.pos.Index]]
		b.NumTargets += fillRow(b.Inputs[r*l.t:(r+1)*l.t], b.Targets[r*l.t:(r+1)*l.t], ex, 0)
		l.pos.Index++
		if l.pos.Index == len(l.ex) {
			l.pos = Position{Epoch: l.pos.Epoch + 1}
		}
	}
}

// nextPacked fills each row with the next examples while the next one
// fits (an example of L tokens takes L-1 places), then pads it. Every
// example fits an empty row (NewLoader checks L <= T+1), so a row always
// takes at least one.
func (l *Loader) nextPacked(b *Batch) {
	b.resizePacked(l.b, l.t)
	T := l.t
	for r := range l.b {
		in, tg, pos := b.Inputs[r*T:(r+1)*T], b.Targets[r*T:(r+1)*T], b.Positions[r*T:(r+1)*T]
		used, pad := 0, int32(0)
		for {
			ex := l.ex[l.order(l.pos.Epoch)[l.pos.Index]]
			n := len(ex.Tokens) - 1
			if used > 0 && used+n > T {
				break
			}
			pad = ex.Tokens[n] // the final token, as an unpacked row pads
			b.NumTargets += fillRow(in[used:used+n], tg[used:used+n], ex, 0)
			for i := range n {
				pos[used+i] = int32(i)
			}
			used += n
			l.pos.Index++
			if l.pos.Index == len(l.ex) {
				l.pos = Position{Epoch: l.pos.Epoch + 1}
			}
			if used == T {
				break
			}
		}
		for i := used; i < T; i++ {
			in[i], tg[i], pos[i] = pad, -1, int32(i-used)
		}
	}
}

// Position returns the position of the next example.
func (l *Loader) Position() Position { return l.pos }

// Seek moves to p, as saved by Position; Index may equal the number of
// examples, meaning the start of the next epoch.
func (l *Loader) Seek(p Position) error {
	if p.Epoch < 0 || p.Index < 0 || p.Index > len(l.ex) {
		return fmt.Errorf("data: seek to epoch %d index %d: want epoch >= 0 and index in [0, %d]", p.Epoch, p.Index, len(l.ex))
	}
	if p.Index == len(l.ex) {
		p = Position{Epoch: p.Epoch + 1}
	}
	l.pos = p
	return nil
}

// Epoch returns the epochs consumed so far, fractional (1.5 = one epoch and
// half of the next).
func (l *Loader) Epoch() float64 {
	return float64(l.pos.Epoch) + float64(l.pos.Index)/float64(len(l.ex))
}

// EpochRows is the number of rows one epoch fills: Len without packing;
// with it, the rows the greedy packing of epoch 0's order takes (other
// epochs' orders differ by a few rows at most).
func (l *Loader) EpochRows() int {
	if !l.pack {
		return len(l.ex)
	}
	rows, used := 0, 0
	for _, i := range newRNG(l.seed, streamOf("loader")).perm(len(l.ex)) {
		n := len(l.ex[i].Tokens) - 1
		if used == 0 || used+n > l.t {
			rows++
			used = 0
		}
		used += n
	}
	return rows
}

// Len returns the number of examples in one epoch.
func (l *Loader) Len() int { return len(l.ex) }

// EvalBatches cuts examples, in order, into batches of B rows of T; rows of
// the last batch past the end have no targets (their inputs repeat the final
// token of the first example). Examples longer than T+1 are cut. It returns
// nil for no examples or a shape below 1.
func EvalBatches(examples []Example, B, T int) []Batch {
	if len(examples) == 0 || B < 1 || T < 1 {
		return nil
	}
	var pad int32
	if t := examples[0].Tokens; len(t) > 0 {
		pad = t[len(t)-1]
	}
	out := make([]Batch, 0, (len(examples)+B-1)/B)
	for lo := 0; lo < len(examples); lo += B {
		var b Batch
		b.resize(B, T)
		for r := range B {
			in, tg := b.Inputs[r*T:(r+1)*T], b.Targets[r*T:(r+1)*T]
			if lo+r < len(examples) {
				b.NumTargets += fillRow(in, tg, examples[lo+r], pad)
			} else {
				fillRow(in, tg, Example{}, pad)
			}
		}
		out = append(out, b)
	}
	return out
}
