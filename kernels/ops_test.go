package kernels_test

import (
	"reflect"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// TestOpsHaveLaunchers: every compute op of the Backend contract has its
// launcher in kernels.h, hence a function in the generated face
// (docs/DESIGN.md, "The op table"). The op's launcher is the one
// backend's dtype table names (backend.KernelDTypes); the table's dtype flags
// must be the launcher's DType parameters, all of them.
func TestOpsHaveLaunchers(t *testing.T) {
	ops := reflect.TypeOf((*backend.Ops)(nil)).Elem()
	if ops.NumMethod() == 0 {
		t.Fatal("backend.Ops has no methods: the reflection is wrong")
	}
	table := map[string]backend.OpDTypes{}
	for _, o := range backend.KernelDTypes() {
		table[o.Op] = o
	}
	for i := range ops.NumMethod() {
		m := ops.Method(i).Name
		o, ok := table[m]
		if !ok {
			t.Errorf("backend.Ops.%s has no entry (hence no launcher) in backend.KernelDTypes", m)
			continue
		}
		l, ok := kernels.Lookup(o.Launcher)
		if !ok || !l.IsLaunch() {
			t.Errorf("backend.Ops.%s has no launcher %s in kernels.h (regenerated face: kernels.Launchers); every op needs one (docs/DESIGN.md, The op table)", m, o.Launcher)
			continue
		}
		flags := map[string]bool{}
		for _, p := range l.Params {
			if p.GoType == "DType" {
				flags[p.Name] = true
			}
		}
		for _, g := range o.Groups {
			if g.Flag == "" {
				continue
			}
			if !flags[g.Flag] {
				t.Errorf("backend.Ops.%s: the dtype table's flag %s (for %v) is not a dtype parameter of %s", m, g.Flag, g.Args, l.C)
			}
			delete(flags, g.Flag)
		}
		for f := range flags {
			t.Errorf("backend.Ops.%s: %s's dtype parameter %s chooses no argument's type in the dtype table", m, l.C, f)
		}
	}
	// Backend.CopyD2D converts between dtypes on the device: a same-dtype
	// copy is a cudaMemcpyAsync, the conversions are launchers.
	if _, ok := reflect.TypeOf((*backend.Backend)(nil)).Elem().MethodByName("CopyD2D"); !ok {
		t.Error("backend.Backend has no CopyD2D any more: drop its launchers from this test")
	}
	for _, c := range []string{"lsp_cast_f32_to_bf16", "lsp_cast_bf16_to_f32"} {
		if l, ok := kernels.Lookup(c); !ok || !l.IsLaunch() {
			t.Errorf("backend.Backend.CopyD2D has no launcher %s in kernels.h", c)
		}
	}
}

// The dtype flags of the launchers are backend.DType's numbers.
func TestDTypeFlags(t *testing.T) {
	if int(kernels.F32) != int(backend.F32) || int(kernels.BF16) != int(backend.BF16) {
		t.Errorf("kernels.F32, BF16 = %d, %d; backend.F32, BF16 = %d, %d", kernels.F32, kernels.BF16, backend.F32, backend.BF16)
	}
}

// Every launcher takes its stream last and every pointer as a Ptr: what
// the generated functions assume.
func TestLaunchersTable(t *testing.T) {
	if len(kernels.Launchers) == 0 {
		t.Fatal("no launchers")
	}
	for _, l := range kernels.Launchers {
		if !l.IsLaunch() {
			continue
		}
		last := l.Params[len(l.Params)-1]
		if last.CType != "cudaStream_t" || last.GoType != "Stream" {
			t.Errorf("%s: last parameter %+v, want the stream", l.C, last)
		}
		for _, p := range l.Params {
			if isPtr := p.CType[len(p.CType)-1] == '*'; isPtr != (p.GoType == "Ptr") {
				t.Errorf("%s: parameter %s (%s) has Go type %s", l.C, p.Name, p.CType, p.GoType)
			}
		}
	}
	if kernels.SumSquaresWork != backend.SumSquaresWork {
		t.Errorf("kernels.SumSquaresWork (LSP_SUM_SQUARES_WORK) = %d, backend.SumSquaresWork = %d", kernels.SumSquaresWork, backend.SumSquaresWork)
	}
}
