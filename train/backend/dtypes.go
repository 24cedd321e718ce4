// The storage types every op accepts on every backend, as data: the CUDA
// backend checks each op against it when the op is enqueued (so an fp32
// GEMM is refused by name, not by a launch error), the CPU backend checks
// against it in its KernelDTypes mode, the package doc shows it, and the
// tests hold it to the op signatures (backend.go) and to the launchers'
// (kernels/kernels.h).
//
// The table is what the CUDA kernels take. The CPU backend accepts more
// (any mix of fp32 and bf16 in every float argument, fp32 GEMM and
// attention), so a schedule that runs on the CPU backend may still be
// refused on the GPU; run it once with cpu.Config.KernelDTypes to find out
// without one.

package backend

import (
	"fmt"
	"slices"
	"strings"
)

// DTypeGroup is tensor arguments of one op that share one storage type:
// those a launcher's *_bf16 argument (Flag) chooses the type of, or those
// of one fixed pointer type (Flag "").
type DTypeGroup struct {
	Args   []string // the Ops method's parameter names
	DTypes []DType  // the types allowed (one, when fixed)
	Flag   string   // the launcher's int argument that picks among DTypes
}

// OpDTypes is the storage types of one op's tensor arguments.
type OpDTypes struct {
	Op string // the Ops method
	// Launcher is the op's function in kernels/kernels.h. Pending: its
	// kernel is not in kernels.h yet, and the types are the CPU
	// backend's, each argument on its own.
	Launcher string
	Pending  bool
	Args     []string // every tensor parameter, in the method's order
	Groups   []DTypeGroup
}

// The dtype sets of the table.
var (
	onlyF32  = []DType{F32}
	onlyBF16 = []DType{BF16}
	onlyI32  = []DType{I32}
	onlyF64  = []DType{F64}
	storage  = []DType{F32, BF16}
)

// grp builds a group: fixed when flag is "".
func grp(dts []DType, flag string, args ...string) DTypeGroup {
	return DTypeGroup{Args: args, DTypes: dts, Flag: flag}
}

// perTensor is an op whose launcher has one *_bf16 flag per tensor (the
// elementwise family): every argument fp32 or bf16 on its own, as on the
// CPU backend.
func perTensor(op, launcher string, args ...string) OpDTypes {
	o := OpDTypes{Op: op, Launcher: launcher, Args: args}
	for _, a := range args {
		o.Groups = append(o.Groups, grp(storage, a+"_bf16", a))
	}
	return o
}

// kernelDTypes is the table, in the order of the Ops methods.
var kernelDTypes = []OpDTypes{
	perTensor("Fill", "lsp_fill", "t"),
	perTensor("Scale", "lsp_scale", "t"),
	perTensor("Add", "lsp_add", "out", "a", "b"),
	perTensor("Accumulate", "lsp_accumulate", "dst", "src"),
	{Op: "EncoderForward", Launcher: "lsp_encoder_forward", Args: []string{"out", "inp", "pos", "wte", "wpe"},
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "wte", "wpe"), grp(onlyI32, "", "inp", "pos")}},
	{Op: "EncoderBackward", Launcher: "lsp_encoder_backward", Args: []string{"dwte", "dwpe", "dout", "inp", "pos"},
		Groups: []DTypeGroup{grp(storage, "dw_bf16", "dwte", "dwpe"), grp(storage, "g_bf16", "dout"), grp(onlyI32, "", "inp", "pos")}},
	{Op: "LayerNormForward", Launcher: "lsp_layernorm_forward", Args: []string{"out", "mean", "rstd", "inp", "weight", "bias"},
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "inp", "weight", "bias"), grp(onlyF32, "", "mean", "rstd")}},
	{Op: "LayerNormBackward", Launcher: "lsp_layernorm_backward",
		Args: []string{"dinp", "dweight", "dbias", "dout", "inp", "weight", "mean", "rstd", "scratch"},
		Groups: []DTypeGroup{grp(storage, "g_bf16", "dinp", "dout"), grp(storage, "dw_bf16", "dweight", "dbias"),
			grp(storage, "x_bf16", "inp", "weight"), grp(onlyF32, "", "mean", "rstd", "scratch")}},
	{Op: "Gemm", Launcher: "lsp_gemm_bf16", Args: []string{"A", "B", "C"},
		Groups: []DTypeGroup{grp(onlyBF16, "", "A", "B"), grp(storage, "c_is_bf16", "C")}},
	{Op: "GemmQ", Launcher: "lsp_gemm_q", Args: []string{"A", "C"},
		Groups: []DTypeGroup{grp(onlyBF16, "", "A"), grp(storage, "c_is_bf16", "C")}},
	perTensor("Dequantize", "lsp_dequantize", "out"),
	perTensor("AddBias", "lsp_add_bias", "out", "bias"),
	perTensor("BiasBackward", "lsp_bias_backward", "dbias", "dout"),
	{Op: "AttentionForward", Launcher: "lsp_attention_forward", Args: []string{"out", "lse", "qkv", "pos"},
		Groups: []DTypeGroup{grp(onlyBF16, "", "out", "qkv"), grp(onlyF32, "", "lse"), grp(onlyI32, "", "pos")}},
	{Op: "AttentionBackward", Launcher: "lsp_attention_backward", Args: []string{"dqkv", "dout", "qkv", "out", "lse", "pos", "scratch"},
		Groups: []DTypeGroup{grp(onlyBF16, "", "dqkv", "dout", "qkv", "out"), grp(onlyF32, "", "lse", "scratch"), grp(onlyI32, "", "pos")}},
	{Op: "GeluForward", Launcher: "lsp_gelu_forward", Args: []string{"out", "inp"},
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "inp")}},
	{Op: "GeluBackward", Launcher: "lsp_gelu_backward", Args: []string{"dinp", "inp", "dout"},
		Groups: []DTypeGroup{grp(storage, "g_bf16", "dinp", "dout"), grp(storage, "x_bf16", "inp")}},
	{Op: "SwiGLUForward", Launcher: "lsp_swiglu_forward", Args: []string{"out", "gate", "up"},
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "gate", "up")}},
	{Op: "SwiGLUBackward", Launcher: "lsp_swiglu_backward", Args: []string{"dgate", "dup", "dout", "gate", "up"},
		Groups: []DTypeGroup{grp(storage, "g_bf16", "dgate", "dup", "dout"), grp(storage, "x_bf16", "gate", "up")}},
	{Op: "RMSNormForward", Launcher: "lsp_rmsnorm_forward", Args: []string{"out", "rstd", "inp", "weight"},
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "inp", "weight"), grp(onlyF32, "", "rstd")}},
	{Op: "RMSNormBackward", Launcher: "lsp_rmsnorm_backward",
		Args: []string{"dinp", "dweight", "dout", "inp", "weight", "rstd", "scratch"},
		Groups: []DTypeGroup{grp(storage, "g_bf16", "dinp", "dout"), grp(storage, "dw_bf16", "dweight"),
			grp(storage, "x_bf16", "inp", "weight"), grp(onlyF32, "", "rstd", "scratch")}},
	{Op: "RoPEForward", Launcher: "lsp_rope_forward", Args: []string{"out", "inp", "pos", "invFreq"},
		Groups: []DTypeGroup{grp(storage, "x_bf16", "out", "inp"), grp(onlyF32, "", "invFreq"), grp(onlyI32, "", "pos")}},
	{Op: "RoPEBackward", Launcher: "lsp_rope_backward", Args: []string{"dinp", "dout", "pos", "invFreq"},
		Groups: []DTypeGroup{grp(storage, "x_bf16", "dinp", "dout"), grp(onlyF32, "", "invFreq"), grp(onlyI32, "", "pos")}},
	{Op: "CrossEntropyForwardBackward", Launcher: "lsp_cross_entropy_forward_backward", Args: []string{"losses", "logits", "targets"},
		Groups: []DTypeGroup{grp(onlyF32, "", "losses"), grp(storage, "x_bf16", "logits"), grp(onlyI32, "", "targets")}},
	{Op: "SumSquares", Launcher: "lsp_sum_squares", Args: []string{"out", "x", "work"},
		Groups: []DTypeGroup{grp(onlyF32, "", "out"), grp(storage, "x_bf16", "x"), grp(onlyF64, "", "work")}},
	{Op: "NonFiniteFlag", Launcher: "lsp_non_finite_flag", Args: []string{"flag", "x"},
		Groups: []DTypeGroup{grp(onlyF32, "", "flag", "x")}},
	{Op: "AdamW", Launcher: "lsp_adamw", Args: []string{"param", "master", "grad", "m", "v", "sumSq", "skip"},
		Groups: []DTypeGroup{grp(storage, "param_bf16", "param"), grp(storage, "grad_bf16", "grad"),
			grp(onlyF32, "", "master", "m", "v", "sumSq", "skip")}},
	{Op: "SparseCompressA", Launcher: "lsp_sparse_compress_a", Args: []string{"A", "X", "colptr", "rowidx", "colval"},
		Groups: []DTypeGroup{grp(onlyF32, "", "A", "colval"), grp(storage, "x_bf16", "X"), grp(onlyI32, "", "colptr", "rowidx")}},
	{Op: "SparseCompressB", Launcher: "lsp_sparse_compress_b", Args: []string{"B", "dY", "colptr", "rowidx", "colval"},
		Groups: []DTypeGroup{grp(onlyF32, "", "B", "colval"), grp(storage, "dy_bf16", "dY"), grp(onlyI32, "", "colptr", "rowidx")}},
	{Op: "SparseS", Launcher: "lsp_sparse_s", Args: []string{"S", "A", "B"},
		Groups: []DTypeGroup{grp(onlyF32, "", "S", "A", "B")}},
	{Op: "SparseApply", Launcher: "lsp_sparse_apply", Args: []string{"W", "T", "Delta", "pidx", "pval", "qidx", "qval", "skip"},
		Groups: []DTypeGroup{grp(storage, "w_bf16", "W"), grp(onlyF32, "", "T", "Delta", "pval", "qval", "skip"), grp(onlyI32, "", "pidx", "qidx")}},
	{Op: "SparseValueGrad", Launcher: "lsp_sparse_value_grad", Args: []string{"out", "Y", "M", "K", "idx", "val"},
		Groups: []DTypeGroup{grp(onlyF32, "", "out", "Y", "M", "K", "val"), grp(onlyI32, "", "idx")}},
	{Op: "DenseGemm", Launcher: "lsp_dense_gemm", Args: []string{"A", "B", "C"},
		Groups: []DTypeGroup{grp(storage, "a_bf16", "A"), grp(storage, "b_bf16", "B"), grp(onlyF32, "", "C")}},
	{Op: "DenseApply", Launcher: "lsp_dense_apply", Args: []string{"A", "B", "W", "skip"},
		Groups: []DTypeGroup{grp(onlyF32, "", "A", "B", "skip"), grp(storage, "w_bf16", "W")}},
}

// KernelDTypes returns the table, one entry per Ops method (a copy).
func KernelDTypes() []OpDTypes {
	out := make([]OpDTypes, len(kernelDTypes))
	for i, o := range kernelDTypes {
		o.Args = slices.Clone(o.Args)
		o.Groups = slices.Clone(o.Groups)
		for j := range o.Groups {
			o.Groups[j].Args = slices.Clone(o.Groups[j].Args)
			o.Groups[j].DTypes = slices.Clone(o.Groups[j].DTypes)
		}
		out[i] = o
	}
	return out
}

func lookupDTypes(op string) (*OpDTypes, error) {
	for i := range kernelDTypes {
		if kernelDTypes[i].Op == op {
			return &kernelDTypes[i], nil
		}
	}
	return nil, fmt.Errorf("%s: no such op in the dtype table", op)
}

// Accepts reports whether argument arg of op may have dtype dt on every
// backend.
func Accepts(op, arg string, dt DType) bool {
	o, err := lookupDTypes(op)
	if err != nil {
		return false
	}
	for _, gr := range o.Groups {
		if slices.Contains(gr.Args, arg) {
			return slices.Contains(gr.DTypes, dt)
		}
	}
	return false
}

// CheckDTypes checks the storage types of op's tensors against the table:
// ts are the op's tensor arguments in its Ops method's order, a tensor
// with a nil Buf standing for an absent optional one (AdamW's master and
// sumSq). The error names the op, every tensor's dtype and what the
// kernel takes instead, e.g.
//
//	Gemm(A fp32, B fp32, C fp32): A, B must be bf16 (the kernel has no other path)
func CheckDTypes(op string, ts ...Tensor) error {
	o, err := lookupDTypes(op)
	if err != nil {
		return err
	}
	if len(ts) != len(o.Args) {
		return fmt.Errorf("%s: %d tensors checked, the op has %d (%s)", op, len(ts), len(o.Args), strings.Join(o.Args, ", "))
	}
	dt := map[string]DType{}
	var sig []string
	for i, a := range o.Args {
		if ts[i].Buf == nil {
			sig = append(sig, a+" absent")
			continue
		}
		dt[a] = ts[i].DType
		sig = append(sig, a+" "+ts[i].DType.String())
	}
	var why []string
	for _, gr := range o.Groups {
		var present []string
		first := DType(0)
		bad, mixed := false, false
		for _, a := range gr.Args {
			d, ok := dt[a]
			if !ok {
				continue
			}
			if len(present) == 0 {
				first = d
			} else if d != first {
				mixed = true
			}
			present = append(present, a)
			bad = bad || !slices.Contains(gr.DTypes, d)
		}
		names := strings.Join(gr.Args, ", ")
		switch {
		case bad && len(gr.DTypes) == 1:
			why = append(why, fmt.Sprintf("%s must be %v (the kernel has no other path)", names, gr.DTypes[0]))
		case bad:
			why = append(why, fmt.Sprintf("%s must be one of %s", names, dtypeList(gr.DTypes)))
		case mixed:
			why = append(why, fmt.Sprintf("%s must share one dtype (the kernel's %s)", names, gr.Flag))
		}
	}
	if len(why) > 0 {
		return fmt.Errorf("%s(%s): %s", op, strings.Join(sig, ", "), strings.Join(why, "; "))
	}
	return nil
}

func dtypeList(dts []DType) string {
	s := make([]string, len(dts))
	for i, d := range dts {
		s[i] = d.String()
	}
	return strings.Join(s, "|")
}

// DTypeTable renders the table as the package doc shows it: one line per
// op, its groups separated by semicolons, the launcher's flag in brackets.
func DTypeTable() string {
	var b strings.Builder
	w := 0
	for _, o := range kernelDTypes {
		w = max(w, len(o.Op))
	}
	for _, o := range kernelDTypes {
		var gs []string
		for _, gr := range o.Groups {
			s := strings.Join(gr.Args, ", ") + ": " + dtypeList(gr.DTypes)
			if gr.Flag != "" {
				s += " [" + gr.Flag + "]"
			}
			gs = append(gs, s)
		}
		line := fmt.Sprintf("%-*s  %s", w, o.Op, strings.Join(gs, "; "))
		if o.Pending {
			line += " (kernel pending)"
		}
		b.WriteString(strings.TrimRight(line, " ") + "\n")
	}
	return b.String()
}
