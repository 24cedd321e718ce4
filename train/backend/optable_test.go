// Tests of the op table: in step with what is generated from it (ops_gen.go
// regenerated in memory), every entry well formed and its expressions
// evaluating, calls surviving the trip through OpsFunc and Run, and every
// op backed by a CPU test, a simulator test and a calibration case.

package backend

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend/internal/opgen"
)

// TestOpsGenUpToDate: an op added to the table without `go generate
// ./train/backend` fails here.
func TestOpsGenUpToDate(t *testing.T) {
	src, err := os.ReadFile("optable.go")
	if err != nil {
		t.Fatal(err)
	}
	want, err := opgen.Generate(src)
	if err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile("ops_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, want) {
		t.Error("ops_gen.go is out of date with optable.go: run `go generate ./train/backend` and commit the result")
	}
}

// idBuf is a buffer with no memory, for calls that are only evaluated.
type idBuf struct{ id int }

func (b idBuf) ID() int        { return b.id }
func (b idBuf) Name() string   { return "fake" }
func (b idBuf) Bytes() int64   { return 1 << 40 }
func (b idBuf) String() string { return "fake" }

// sampleArgs are arguments for every parameter of method m of Ops: every
// tensor present (a distinct buffer each) or every one absent, and a
// distinct value for every other parameter (ints 4 and up), so that a
// call's fields can be told apart.
func sampleArgs(m reflect.Method, absent bool) []reflect.Value {
	args := []reflect.Value{reflect.Zero(m.Type.In(0))} // the stream
	for i := 1; i < m.Type.NumIn(); i++ {
		var v any
		switch typ := m.Type.In(i); typ {
		case reflect.TypeFor[Tensor]():
			t := Tensor{Buf: idBuf{i}, Off: i, Shape: []int{64 + i}, DType: F32}
			if absent {
				t = Tensor{}
			}
			v = t
		case reflect.TypeFor[int]():
			v = 3 + i
		case reflect.TypeFor[float32]():
			v = float32(i) / 2
		case reflect.TypeFor[bool]():
			v = i%2 == 0
		case reflect.TypeFor[uint64]():
			v = uint64(100 + i)
		case reflect.TypeFor[uint32]():
			v = uint32(200 + i)
		case reflect.TypeFor[Quant]():
			v = Quant{Format: NF4, Rows: 4, Cols: 4, Codes: Tensor{Buf: idBuf{100}, Shape: []int{2}, DType: I32},
				Absmax: Tensor{Buf: idBuf{101}, Shape: []int{1}, DType: I32}, Scale: Tensor{Buf: idBuf{102}, Shape: []int{2}, DType: F32},
				Book: Tensor{Buf: idBuf{103}, Shape: []int{QBookLen}, DType: F32}}
		case reflect.TypeFor[QKVLayout]():
			v = QKVPlanar
		case reflect.TypeFor[AdamParams]():
			v = AdamParams{LR: 1e-3, Step: 3, MaxNorm: 1}
		default:
			panic("sampleArgs: no sample of " + typ.String())
		}
		args = append(args, reflect.ValueOf(v))
	}
	return args
}

// record makes the call of method name with args on a recorder.
func record(t *testing.T, name string, args []reflect.Value) *Call {
	t.Helper()
	var got *Call
	rec := OpsFunc(func(_ Stream, c *Call) error { got = c; return nil })
	m := reflect.ValueOf(rec).MethodByName(name)
	if out := m.Call(args); !out[0].IsNil() {
		t.Fatalf("%s: recorder failed: %v", name, out[0].Interface())
	}
	return got
}

func TestOpTable(t *testing.T) {
	ops := reflect.TypeFor[Ops]()
	if len(opTable) != ops.NumMethod() || len(opSignatures) != ops.NumMethod() {
		t.Fatalf("%d table entries, %d signatures, %d Ops methods", len(opTable), len(opSignatures), ops.NumMethod())
	}
	families := []string{famGemm, famAttention, famNorm, famActivation, famElementwise, famSparse, famDense,
		famEmbedding, famLoss, famAdam, famReduce}
	shorts := map[string]bool{}
	for i := range opTable {
		d := &opTable[i]
		if d.Name != opSignatures[i].Op {
			t.Errorf("entry %d is %s, the interface's method %d is %s", i, d.Name, i, opSignatures[i].Op)
			continue
		}
		m, _ := reflect.TypeFor[OpsFunc]().MethodByName(d.Name)
		if shorts[d.Short] || d.Short == "" {
			t.Errorf("%s: short name %q empty or taken", d.Name, d.Short)
		}
		shorts[d.Short] = true
		if !slices.Contains(families, d.Family) {
			t.Errorf("%s: unknown family %q", d.Name, d.Family)
		}
		if !strings.HasPrefix(d.Launcher, "lsp_") {
			t.Errorf("%s: launcher %q", d.Name, d.Launcher)
		}
		var tensors, names []string
		for _, p := range opSignatures[i].Params {
			if p.Kind == KindTensors {
				tensors = append(tensors, p.Name)
			}
		}
		for _, a := range d.TensorArgs() {
			names = append(names, a.Name)
		}
		if !slices.Equal(names, tensors) {
			t.Errorf("%s: Args names %v, the method's tensors are %v", d.Name, names, tensors)
		}
		if !slices.Contains(tensors, d.DType) {
			t.Errorf("%s: DType %q is not a tensor parameter", d.Name, d.DType)
		}
		// Every expression evaluates, with every tensor present and with
		// every tensor absent (optional ones may be).
		for _, absent := range []bool{false, true} {
			c := record(t, d.Name, sampleArgs(reflect.Method{Type: withRecv(m.Type)}, absent))
			for _, a := range d.TensorArgs() {
				if a.Count == "" {
					continue
				}
				if n, err := c.Eval(a.Count); err != nil || n < 0 {
					t.Errorf("%s: count of %s: %d, %v", d.Name, a.Name, n, err)
				}
			}
			if f, err := c.Eval(d.FLOPs + "+0"); d.FLOPs != "" && (err != nil || f <= 0 && !absent) {
				t.Errorf("%s: FLOPs %q = %d, %v", d.Name, d.FLOPs, f, err)
			}
			reads, writes, err := c.Uses()
			if err != nil {
				t.Errorf("%s: %v", d.Name, err)
			} else if !absent && len(writes) == 0 {
				t.Errorf("%s: declares no writes", d.Name)
			}
			_ = reads
		}
	}
}

// withRecv is an OpsFunc method's type as an Ops method's (the receiver
// dropped), which sampleArgs reads.
func withRecv(ft reflect.Type) reflect.Type {
	in := make([]reflect.Type, ft.NumIn()-1)
	for i := range in {
		in[i] = ft.In(i + 1)
	}
	out := []reflect.Type{ft.Out(0)}
	return reflect.FuncOf(in, out, false)
}

// TestCallRun: a call handed to OpsFunc and made again by Run reaches the
// backend with the same arguments in the same places.
func TestCallRun(t *testing.T) {
	for i := range reflect.TypeFor[Ops]().NumMethod() {
		m := reflect.TypeFor[Ops]().Method(i)
		c := record(t, m.Name, sampleArgs(m, false))
		var again *Call
		rec := OpsFunc(func(_ Stream, x *Call) error { again = x; return nil })
		if err := c.Run(rec, nil); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if !reflect.DeepEqual(c, again) {
			t.Errorf("%s: %+v came back as %+v", m.Name, c, again)
		}
		if c.Op != m.Name {
			t.Errorf("%s recorded as %s", m.Name, c.Op)
		}
	}
}

func TestEval(t *testing.T) {
	c := Calls.AttentionBackward(Tensor{}, Tensor{}, Tensor{}, Tensor{}, Tensor{}, Tensor{}, Tensor{Buf: idBuf{1}, Shape: []int{10}}, 2, 3, 4, 2, 8, QKVFused)
	for expr, want := range map[string]int64{
		"B*T*(NH+2*KVH)*HS": 2 * 3 * 8 * 8, "HS/2": 4, "7-3-2": 2, "len(scratch)": 10, "has(pos)": 0, "has(scratch)": 1,
		"AttentionBackwardScratch(B,T,NH)": int64(AttentionBackwardScratch(2, 3, 4)), "SumSquaresWork": SumSquaresWork,
	} {
		if got, err := c.Eval(expr); err != nil || got != want {
			t.Errorf("Eval(%q) = %d, %v; want %d", expr, got, err, want)
		}
	}
	for _, bad := range []string{"B*", "(B", "Q", "layout", "len(B)", "B/0", "nope(B)", "B B"} {
		if _, err := c.Eval(bad); err == nil {
			t.Errorf("Eval(%q) accepted", bad)
		}
	}
}

// TestEveryOpTested walks the table: each op, or its CPU reference of the
// same name (train/cpu's ref_*.go), must be called in a test under train/
// (the references against float64 maths, the models against PyTorch's
// numbers), the op in a test of package cuda (run on the simulated runtime in
// CI, on a GPU where there is one), and be timed by the CPU calibration
// or be named here with the reason it is not.
func TestEveryOpTested(t *testing.T) {
	notCalibrated := map[string]string{
		"Gemm":            "timed by the calibration's GEMM sweep (train/calibrate/gemm.go)",
		"GemmQ":           "costed as a Gemm of its sizes",
		"Dequantize":      "runs at export and checkpoint, not in a step",
		"SparseValueGrad": "the projector fit's, priced by plan's fit time, not per step",
	}
	read := func(glob string) string {
		files, err := filepath.Glob(glob)
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: %v (no files)", glob, err)
		}
		var b strings.Builder
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(src)
		}
		return b.String()
	}
	var cpuTests strings.Builder
	err := filepath.WalkDir("..", func(path string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() && strings.HasSuffix(path, "_test.go") {
			src, err := os.ReadFile(path)
			cpuTests.Write(src)
			return err
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	simTests := read("../../cuda/*_test.go")
	calib := read("../calibrate/*.go")
	for _, d := range opTable {
		call := regexp.MustCompile(`\.` + d.Name + `\(`)
		if !regexp.MustCompile(`\b` + d.Name + `\(`).MatchString(cpuTests.String()) {
			t.Errorf("%s: no test under train/ calls it or its CPU reference", d.Name)
		}
		if !call.MatchString(simTests) {
			t.Errorf("%s: no test of package cuda calls it", d.Name)
		}
		if _, ok := notCalibrated[d.Name]; !ok && !strings.Contains(calib, "Calls."+d.Name+"(") {
			t.Errorf("%s: the CPU calibration does not time it (train/calibrate/ops.go)", d.Name)
		}
	}
}
