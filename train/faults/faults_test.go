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

func TestParseNaN(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want []nanFault // kind, step, micro, n
		bad  bool
	}{
		{spec: "loss@3", want: []nanFault{{kind: NaNLoss, step: 3, n: 1}}},
		{spec: "grad@5/2:4", want: []nanFault{{kind: NaNGrad, step: 5, micro: 2, n: 4}}},
		{spec: "loss@1:2,grad@7/1", want: []nanFault{{kind: NaNLoss, step: 1, n: 2}, {kind: NaNGrad, step: 7, micro: 1, n: 1}}},
		{spec: "both@2/3", want: []nanFault{{kind: NaNBoth, step: 2, micro: 3, n: 1}}},
		{spec: "", bad: true},
		{spec: "inf@3", bad: true},
		{spec: "loss", bad: true},
		{spec: "loss@0", bad: true},
		{spec: "loss@3/-1", bad: true},
		{spec: "loss@3:0", bad: true},
		{spec: "loss@x", bad: true},
		{spec: "loss@3,", bad: true},
	} {
		fs, err := parseNaN(tc.spec)
		if tc.bad != (err != nil) {
			t.Errorf("%q: err = %v", tc.spec, err)
			continue
		}
		if err != nil {
			continue
		}
		if len(fs.entries) != len(tc.want) {
			t.Errorf("%q: %d entries, want %d", tc.spec, len(fs.entries), len(tc.want))
			continue
		}
		for i, f := range fs.entries {
			if w := tc.want[i]; f.kind != w.kind || f.step != w.step || f.micro != w.micro || f.n != w.n {
				t.Errorf("%q entry %d: got %+v, want %+v", tc.spec, i, *f, w)
			}
		}
	}
}

// NaNAt fires at the named step and micro-batch only, for the first N
// passings, and entries for the same place are used up in order.
func TestNaNAt(t *testing.T) {
	if k := NaNAt(3, 0); k != NoNaN {
		t.Fatalf("unarmed: %v", k)
	}
	disarm, err := ArmNaN("loss@3:2,grad@3,grad@4/1")
	if err != nil {
		t.Fatal(err)
	}
	defer disarm()
	var got []NaNKind
	for _, at := range [][2]int{{2, 0}, {3, 1}, {3, 0}, {3, 0}, {3, 0}, {3, 0}, {4, 0}, {4, 1}, {4, 1}} {
		got = append(got, NaNAt(at[0], at[1]))
	}
	want := []NaNKind{NoNaN, NoNaN, NaNLoss, NaNLoss, NaNGrad, NoNaN, NoNaN, NaNGrad, NoNaN}
	if !slices.Equal(got, want) {
		t.Errorf("injections %v, want %v", got, want)
	}
	disarm()
	if k := NaNAt(4, 1); k != NoNaN {
		t.Errorf("disarmed: %v", k)
	}
}
