package kreport

import (
	"fmt"
	"sort"
	"strings"
)

// Kernel is one kernel (one instantiation of a template) as compiled for
// each architecture.
type Kernel struct {
	File    string // its source, "attention.cu"
	Mangled string
	Name    string // demangled, less namespace and parameters: "attn_fwd_tc_kernel<64>"
	Base    string // Name less template arguments
	DynSmem int    // dynamic shared memory its launcher passes (LSP_DYN_SMEM_BYTES)
	Arch    map[string]*ArchInfo
}

// ArchInfo is a kernel on one architecture.
type ArchInfo struct {
	Resources       // Shared: static shared memory, less the reservation sm_90 cubins carry
	Threads   int   // threads per block (its __launch_bounds__)
	Spill     Spill // from ptxas where Stack > 0; zero otherwise (spills live in the stack frame)
	SASS      *SASS // nil where not disassembled
	Occ       Occupancy
}

// ShortName turns c++filt's "void (anonymous namespace)::f<64>(int,
// float*)" into "f<64>" (the return type, which templates' names carry, the
// namespace and the parameters dropped), and gives the template's name,
// "f", too.
func ShortName(demangled string) (name, base string) {
	name = strings.ReplaceAll(demangled, "(anonymous namespace)::", "")
	name = strings.ReplaceAll(name, "<unnamed>::", "") // cu++filt's spelling
	// The parameter list starts at the first parenthesis outside template
	// arguments; the return type ends at the last space before it.
	depth, start, cut := 0, 0, len(name)
scan:
	for i, r := range name {
		switch r {
		case '<':
			depth++
		case '>':
			depth--
		case ' ':
			if depth == 0 {
				start = i + 1
			}
		case '(':
			if depth == 0 {
				cut = i
				break scan
			}
		}
	}
	name = name[start:cut]
	base = name
	if i := strings.IndexByte(name, '<'); i >= 0 {
		base = name[:i]
	}
	return name, base
}

// Check applies the report's rules and returns what fails, one line each
// (none: the kernels pass).
func Check(kernels []*Kernel, claims []Claim) []string {
	var bad []string
	claimed := func(kind string, k *Kernel) bool {
		for _, c := range claims {
			if c.Kind != kind || c.File != k.File {
				continue
			}
			for _, n := range c.Kernels {
				if covers(n, k) {
					return true
				}
			}
		}
		return false
	}
	for _, k := range kernels {
		for _, arch := range sortedArches(k) {
			a := k.Arch[arch]
			spills := a.Spill.Stores > 0 || a.Spill.Loads > 0
			switch {
			case spills && !claimed(ClaimSpills, k):
				bad = append(bad, fmt.Sprintf("%s (%s) on %s: %d bytes of spill stores, %d of spill loads, and no line \"%s (%s): why\" in %s",
					k.Name, k.File, arch, a.Spill.Stores, a.Spill.Loads, ClaimSpills, k.Name, k.File))
			case spills && a.SASS == nil:
				bad = append(bad, fmt.Sprintf("%s (%s) on %s: spills, and its SASS was not read to see where", k.Name, k.File, arch))
			case spills && a.SASS.LocalInInner > 0:
				bad = append(bad, fmt.Sprintf("%s (%s) on %s: %d local loads or stores of spills in an innermost loop",
					k.Name, k.File, arch, a.SASS.LocalInInner))
			case !spills && (a.Stack > 0 || a.Local > 0) && !claimed(ClaimStack, k):
				bad = append(bad, fmt.Sprintf("%s (%s) on %s: %d bytes of stack frame (%d of .local) and no line \"%s (%s): why\" in %s",
					k.Name, k.File, arch, a.Stack, a.Local, ClaimStack, k.Base, k.File))
			}
			if a.Regs >= maxRegsPerThread && !claimed(ClaimRegs, k) {
				bad = append(bad, fmt.Sprintf("%s (%s) on %s: %d registers and no line \"%s (%s): why\" in %s",
					k.Name, k.File, arch, a.Regs, ClaimRegs, k.Name, k.File))
			}
		}
	}
	for _, c := range claims {
		for _, n := range c.Kernels {
			bad = append(bad, checkClaim(c, n, kernels)...)
		}
	}
	return bad
}

// checkClaim holds the kernels one name of a claim covers to it.
func checkClaim(c Claim, name string, kernels []*Kernel) []string {
	var bad []string
	where := fmt.Sprintf("%s:%d: %s (%s)", c.File, c.Line, c.Kind, name)
	found, needed := false, false
	for _, k := range kernels {
		if k.File != c.File || !covers(name, k) {
			continue
		}
		found = true
		for _, arch := range sortedArches(k) {
			a := k.Arch[arch]
			switch c.Kind {
			case ClaimStack:
				needed = needed || a.Stack > 0 || a.Local > 0
			case ClaimSpills:
				needed = needed || a.Spill.Stores > 0 || a.Spill.Loads > 0
			case ClaimRegs:
				needed = needed || a.Regs >= maxRegsPerThread
			case ClaimTensorCores:
				needed = true
				switch {
				case a.SASS == nil:
					bad = append(bad, fmt.Sprintf("%s: %s on %s was not disassembled", where, k.Name, arch))
				case a.SASS.HMMAInLoops == 0:
					bad = append(bad, fmt.Sprintf("%s: %s on %s has no HMMA in a loop (%d in all)", where, k.Name, arch, a.SASS.HMMA))
				}
			}
		}
	}
	switch {
	case !found:
		bad = append(bad, where+": no such kernel in the compiled code")
	case !needed:
		bad = append(bad, where+": no longer so on any architecture; remove the line")
	}
	return bad
}

func sortedArches(k *Kernel) []string {
	out := make([]string, 0, len(k.Arch))
	for a := range k.Arch {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}
