package flagerr

import (
	"errors"
	"strconv"
	"testing"
)

// TestSet: a value that parses is stored; one that does not leaves the
// destination as it was and returns the parser's own error.
func TestSet(t *testing.T) {
	n := 7
	if err := Set(&n, strconv.Atoi, "42"); err != nil || n != 42 {
		t.Fatalf("Set(42) = %v, n = %d; want nil, 42", err, n)
	}
	err := Set(&n, strconv.Atoi, "forty")
	var numErr *strconv.NumError
	if !errors.As(err, &numErr) {
		t.Fatalf("Set(forty) = %v, want the parser's *strconv.NumError", err)
	}
	if n != 42 {
		t.Errorf("a refused value changed n to %d", n)
	}
}

// TestError names the flag first, as every package's flag errors do.
func TestError(t *testing.T) {
	if got, want := New("lr", "must be positive, got %v", -1).Error(), "--lr: must be positive, got -1"; got != want {
		t.Errorf("New(...).Error() = %q, want %q", got, want)
	}
}
