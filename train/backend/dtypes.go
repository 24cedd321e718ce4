// The storage types every op accepts on every backend, as data: the CUDA
// backend checks each op against it when the op is enqueued (so an fp32
// GEMM is refused by name, not by a launch error), the CPU backend checks
// against it in its KernelDTypes mode, the package doc shows it, and the
// tests hold it to the op signatures (the table's) and to the launchers'
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

// kernelDTypes is the op table's storage types (optable.go), in the
// order of the Ops methods.
var kernelDTypes = func() []OpDTypes {
	out := make([]OpDTypes, len(opTable))
	for i := range opTable {
		d := &opTable[i]
		o := OpDTypes{Op: d.Name, Launcher: d.Launcher, Groups: d.Groups}
		for _, a := range d.TensorArgs() {
			o.Args = append(o.Args, a.Name)
		}
		out[i] = o
	}
	return out
}()

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
