package kreport

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// SASS is what the disassembly of one kernel on one architecture shows:
// tensor-core instructions (HMMA) and local memory accesses (LDL, STL), in
// all, inside loops and inside innermost loops. A loop is the span from a
// backward branch's target to the branch, so the inner loops of a GEMM or
// attention kernel count, and so does the grid-stride loop of an
// elementwise one; an innermost loop holds no other.
type SASS struct {
	HMMA, HMMAInLoops                 int
	Local, LocalInLoops, LocalInInner int
}

var (
	sassSection = regexp.MustCompile(`^\.text\.(\S+):$`)
	sassLabel   = regexp.MustCompile(`^(\.L_x_\d+):$`)
	sassInstr   = regexp.MustCompile(`^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*)$`)
	sassBranch  = regexp.MustCompile("`\\((\\.L_x_\\d+)\\)")
)

type instr struct {
	addr   int
	opcode string
	target string // a branch's label
}

// ParseSASS reads nvdisasm's output for one cubin; the result is keyed by
// the .text section's function, whose code includes the subroutines it
// calls (the slow paths of division and square root).
func ParseSASS(text string) (map[string]SASS, error) {
	out := map[string]SASS{}
	fn := ""
	var code []instr
	labels := map[string]int{}
	var pending []string // labels waiting for the next instruction's address
	flush := func() error {
		if fn == "" {
			return nil
		}
		s, err := summarize(code, labels)
		if err != nil {
			return fmt.Errorf("sass of %s: %w", fn, err)
		}
		out[fn] = s
		return nil
	}
	for n, line := range strings.Split(text, "\n") {
		if m := sassSection.FindStringSubmatch(line); m != nil {
			if err := flush(); err != nil {
				return nil, err
			}
			fn, code, labels, pending = m[1], nil, map[string]int{}, nil
			continue
		}
		if fn == "" {
			continue
		}
		if m := sassLabel.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			pending = append(pending, m[1])
			continue
		}
		m := sassInstr.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		addr, err := strconv.ParseInt(m[1], 16, 64)
		if err != nil {
			return nil, fmt.Errorf("sass line %d: %w", n+1, err)
		}
		for _, l := range pending {
			labels[l] = int(addr)
		}
		pending = nil
		in := instr{addr: int(addr), opcode: m[2]}
		if strings.HasPrefix(in.opcode, "BRA") {
			if b := sassBranch.FindStringSubmatch(m[3]); b != nil {
				in.target = b[1]
			}
		}
		code = append(code, in)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// summarize counts one function's instructions, in loops and in all.
func summarize(code []instr, labels map[string]int) (SASS, error) {
	type span struct{ lo, hi int }
	var loops []span
	for _, in := range code {
		if in.target == "" {
			continue
		}
		to, ok := labels[in.target]
		if !ok {
			return SASS{}, fmt.Errorf("branch at %#x to %s, a label not in the function", in.addr, in.target)
		}
		if to <= in.addr {
			loops = append(loops, span{to, in.addr})
		}
	}
	inLoop := func(addr int, inner bool) bool {
		for i, l := range loops {
			if addr < l.lo || addr > l.hi {
				continue
			}
			if !inner {
				return true
			}
			holds := false
			for j, o := range loops {
				holds = holds || (j != i && l.lo <= o.lo && o.hi <= l.hi && o != l)
			}
			if !holds {
				return true
			}
		}
		return false
	}
	var s SASS
	for _, in := range code {
		op := in.opcode
		switch {
		case strings.HasPrefix(op, "HMMA"):
			s.HMMA++
			if inLoop(in.addr, false) {
				s.HMMAInLoops++
			}
		case strings.HasPrefix(op, "LDL") || strings.HasPrefix(op, "STL"):
			s.Local++
			if inLoop(in.addr, false) {
				s.LocalInLoops++
			}
			if inLoop(in.addr, true) {
				s.LocalInInner++
			}
		}
	}
	return s, nil
}
