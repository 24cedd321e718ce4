// Package commtest holds what the tests of the communicators share
// (train/comm/mpi's over MPI, cuda's over NCCL): inputs whose sums tell
// one order of the ranks from another, a bit-for-bit comparison, and the
// line with which a rank launched under mpirun says its checks passed.
package commtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"testing"
)

// Input is rank r's buffer of n elements in case k: values whose
// exponents spread over 2^-20..2^20, so that the order of a sum changes
// its bits.
func Input(r, n, k int) []float32 {
	rng := rand.New(rand.NewPCG(uint64(r), uint64(n)<<8|uint64(k)))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(41)-20))
	}
	return x
}

// SameBits says where a and b differ, bit for bit, or returns nil.
func SameBits(a, b []float32) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d elements, want %d", len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return fmt.Errorf("element %d is %v (%#08x), want %v (%#08x)", i, a[i], math.Float32bits(a[i]), b[i], math.Float32bits(b[i]))
		}
	}
	return nil
}

// PrintPassed is what rank of size ranks prints when its checks passed,
// for CheckPassed to find in mpirun's output.
func PrintPassed(rank, size, checks int) {
	fmt.Printf("rank %d of %d: %d checks passed\n", rank, size, checks)
}

// CheckPassed fails t unless every one of np ranks printed PrintPassed's
// line in out, the output of mpirun -np np.
func CheckPassed(t testing.TB, np int, out string) {
	t.Helper()
	for r := 0; r < np; r++ {
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^rank %d of %d: \d+ checks passed$`, r, np)).MatchString(out) {
			t.Fatalf("mpirun -np %d: rank %d did not pass; output:\n%s", np, r, out)
		}
	}
}

// Fail is what rank prints when a check fails, the line the launching
// test looks for ("FAIL"); it returns the rank's exit code, 1.
func Fail(rank int, format string, a ...any) int {
	fmt.Printf("rank %d: FAIL: %s\n", rank, fmt.Sprintf(format, a...))
	return 1
}
