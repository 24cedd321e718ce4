// simd.go: the instruction-set paths of the C kernels (scalar, AVX2,
// AVX-512), which ones this CPU can run, and the one the kernels use.

package host

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"github.com/klauspost/cpuid/v2"
)

// SIMD names an instruction-set path of the C kernels.
type SIMD int32

// The paths, from slowest to fastest. Every kernel has all three.
const (
	Scalar SIMD = iota // portable C, the reference
	AVX2               // AVX2 + FMA
	AVX512             // AVX-512F
)

func (s SIMD) String() string {
	switch s {
	case Scalar:
		return "scalar"
	case AVX2:
		return "avx2"
	case AVX512:
		return "avx512"
	}
	return fmt.Sprintf("SIMD(%d)", int32(s))
}

// ParseSIMD reads a path name as String writes it.
func ParseSIMD(name string) (SIMD, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "scalar":
		return Scalar, nil
	case "avx2":
		return AVX2, nil
	case "avx512":
		return AVX512, nil
	}
	return Scalar, fmt.Errorf("unknown SIMD path %q (want scalar, avx2 or avx512)", name)
}

// DetectSIMD returns the fastest path this CPU supports.
func DetectSIMD() SIMD {
	switch {
	case cpuid.CPU.Supports(cpuid.AVX512F):
		return AVX512
	case cpuid.CPU.Supports(cpuid.AVX2, cpuid.FMA3):
		return AVX2
	}
	return Scalar
}

// SupportedSIMD lists every path this CPU can run, slowest first, so tests
// can compare each with the scalar reference.
func SupportedSIMD() []SIMD {
	var out []SIMD
	for s := Scalar; s <= DetectSIMD(); s++ {
		out = append(out, s)
	}
	return out
}

// SIMDEnv is the environment variable that caps the path the kernels use,
// for example LSP_SIMD=scalar.
const SIMDEnv = "LSP_SIMD"

var active atomic.Int32

func init() {
	s := DetectSIMD()
	if v := os.Getenv(SIMDEnv); v != "" {
		if want, err := ParseSIMD(v); err == nil && want < s {
			s = want
		}
	}
	active.Store(int32(s))
}

// ActiveSIMD returns the path the kernels use now.
func ActiveSIMD() SIMD { return SIMD(active.Load()) }

// SetSIMD selects the path the kernels use and returns the previous one. It
// is an error to ask for a path the CPU does not support.
func SetSIMD(s SIMD) (SIMD, error) {
	if s < Scalar || s > DetectSIMD() {
		return ActiveSIMD(), fmt.Errorf("SIMD path %v not supported by this CPU (best: %v)", s, DetectSIMD())
	}
	return SIMD(active.Swap(int32(s))), nil
}
