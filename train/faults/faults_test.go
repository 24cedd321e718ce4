// Tests of the fault specs and of failing from the N-th passing on.

package faults

import (
	"errors"
	"slices"
	"syscall"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		spec, point, file string
		n                 int
		bad               bool
	}{
		{spec: "renamed", point: "renamed", n: 1},
		{spec: "renamed:3", point: "renamed", n: 3},
		{spec: "renamed@checkpoint.safetensors:2", point: "renamed", file: "checkpoint.safetensors", n: 2},
		{spec: "", bad: true},
		{spec: "renamed:0", bad: true},
		{spec: "renamed:x", bad: true},
	} {
		f, err := parse(Kill, tc.spec)
		if tc.bad != (err != nil) {
			t.Errorf("%q: err = %v", tc.spec, err)
			continue
		}
		if err == nil && (f.point != tc.point || f.file != tc.file || f.n != tc.n) {
			t.Errorf("%q: got %+v", tc.spec, f)
		}
	}
}

func TestFailFromNth(t *testing.T) {
	if err := Point("p", "f"); err != nil {
		t.Fatalf("unarmed: %v", err)
	}
	disarm, err := Arm(Fail, "p@f:2")
	if err != nil {
		t.Fatal(err)
	}
	defer disarm()
	var got []bool
	for _, file := range []string{"f", "g", "f", "f"} {
		err := Point("p", file)
		if err != nil && !errors.Is(err, syscall.ENOSPC) {
			t.Fatal(err)
		}
		got = append(got, err != nil)
	}
	if want := []bool{false, false, true, true}; !slices.Equal(got, want) {
		t.Errorf("failures %v, want %v", got, want)
	}
	if Point("q", "f") != nil {
		t.Error("another point failed")
	}
}
