package kreport

import (
	"fmt"
	"regexp"
	"strings"
)

// A Claim is a line of a kernel's .cu file (in its header, or in the
// comment above the kernel) that the report holds the compiled code to:
//
//	stack frame (rope_kernel): why the kernel needs one
//	spills (attn_bwd_dkv_tc_kernel<128>): why they cannot go, and where they are
//	255 registers (attn_bwd_dkv_tc_kernel<128>): why that is acceptable
//	tensor cores (gemm_bf16_nn_kernel, gemm_q_nn_kernel): what they do
//
// A name without template arguments covers every instantiation. A stack
// frame, a spill or 255 registers without such a line fails the report,
// and so does a claim the code no longer needs (a stale reason misleads).
// A spill fails even with its line when one of its loads or stores is in
// an innermost loop of the SASS: only spills the hot loops never touch
// can be explained away (a spill claim covers the stack frame it needs).
// A kernel claimed to use tensor cores must have HMMA inside a loop on
// every architecture.
type Claim struct {
	Kind    string   // ClaimStack, ClaimSpills, ClaimRegs or ClaimTensorCores
	Kernels []string // as written: "rope_kernel", "attn_fwd_tc_kernel<64>"
	Reason  string   // the rest of the line
	File    string
	Line    int
}

// The kinds of claim.
const (
	ClaimStack       = "stack frame"
	ClaimSpills      = "spills"
	ClaimRegs        = "255 registers"
	ClaimTensorCores = "tensor cores"
)

var (
	claimLine = regexp.MustCompile(`(stack frame|spills|255 registers|tensor cores) \(([A-Za-z_][A-Za-z0-9_<>, ]*)\):(.*)$`)
	// A claim whose list of kernels runs on to the next line would be
	// ignored; it is an error instead.
	claimCut = regexp.MustCompile(`(stack frame|spills|255 registers|tensor cores) \([A-Za-z0-9_<>, ]*$`)
)

// ParseClaims finds the claims in one .cu file's source.
func ParseClaims(file string, src []byte) ([]Claim, error) {
	var out []Claim
	for i, line := range strings.Split(string(src), "\n") {
		if claimCut.MatchString(line) {
			return nil, fmt.Errorf("%s:%d: a claim's kernels must be on its first line, closed by \"):\"", file, i+1)
		}
		m := claimLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		c := Claim{Kind: m[1], Kernels: splitNames(m[2]), Reason: strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(m[3]), "*/")), File: file, Line: i + 1}
		if len(c.Kernels) == 0 {
			return nil, fmt.Errorf("%s:%d: %s names no kernel", file, c.Line, c.Kind)
		}
		if c.Kind != ClaimTensorCores && c.Reason == "" {
			return nil, fmt.Errorf("%s:%d: %s (%s) without a reason after the colon", file, c.Line, c.Kind, m[2])
		}
		out = append(out, c)
	}
	return out, nil
}

// splitNames splits "a<1, 2>, b" at the commas outside template arguments.
func splitNames(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s + "," {
		switch r {
		case '<':
			depth++
		case '>':
			depth--
		case ',':
			if depth == 0 {
				if name := strings.TrimSpace(s[start:i]); name != "" {
					out = append(out, name)
				}
				start = i + 1
			}
		}
	}
	return out
}

// Covers reports whether a claim's name covers a kernel, whose Name is
// its instantiation ("attn_fwd_tc_kernel<64>") and Base its template name.
func covers(name string, k *Kernel) bool {
	return name == k.Name || name == k.Base
}
