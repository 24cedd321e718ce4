package kernels_test

import (
	"reflect"
	"sort"
	"testing"

	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// opLaunchers names the launchers of the Backend methods whose launcher is
// not the Go function of the same name (DESIGN.md "one op, three faces":
// every op has one launcher in kernels.h). Every other method of
// backend.Ops must have a launcher whose Go name is the method's.
var opLaunchers = map[string][]string{
	"Gemm": {"lsp_gemm_bf16"}, // bf16 operands on tensor cores; fp32 or bf16 C
	// Backend.CopyD2D converts between dtypes; a same-dtype copy is a
	// cudaMemcpyAsync, the conversions are launchers.
	"CopyD2D": {"lsp_cast_f32_to_bf16", "lsp_cast_bf16_to_f32"},
}

// TestOpsHaveLaunchers: every compute op of the Backend contract has its
// launcher in kernels.h, hence a function in the generated face.
func TestOpsHaveLaunchers(t *testing.T) {
	ops := reflect.TypeOf((*backend.Ops)(nil)).Elem()
	if ops.NumMethod() == 0 {
		t.Fatal("backend.Ops has no methods: the reflection is wrong")
	}
	methods := map[string]bool{}
	for i := range ops.NumMethod() {
		methods[ops.Method(i).Name] = true
	}
	methods["CopyD2D"] = true // on backend.Backend, not Ops, but it converts dtypes on the device
	if _, ok := reflect.TypeOf((*backend.Backend)(nil)).Elem().MethodByName("CopyD2D"); !ok {
		t.Error("backend.Backend has no CopyD2D any more: drop it from this test")
	}
	var names []string
	for m := range methods {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		want, ok := opLaunchers[m]
		if !ok {
			want = []string{m}
		}
		var missing []string
		for _, name := range want {
			l, ok := kernels.Lookup(name)
			if !ok || !l.IsLaunch() {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			t.Errorf("backend.Ops.%s has no launcher %v in kernels.h (regenerated face: kernels.Launchers); every op needs one (DESIGN.md section 5)", m, missing)
		}
	}
	for m := range opLaunchers {
		if !methods[m] {
			t.Errorf("opLaunchers names %s, which backend.Ops does not have", m)
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
	if kernels.SumSquaresWork != 1024 {
		t.Errorf("SumSquaresWork = %d, want kernels.h's LSP_SUM_SQUARES_WORK 1024", kernels.SumSquaresWork)
	}
}
