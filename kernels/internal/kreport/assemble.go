package kreport

import (
	"fmt"
	"sort"
	"strings"
)

// DynSmemPrefix starts the name of the host symbol LSP_DYN_SMEM_BYTES
// (kernels/common.cuh) defines for a kernel: the constant its launcher
// passes as dynamic shared memory, read back from the compiled object.
const DynSmemPrefix = "lsp_dyn_smem_bytes_"

// Object is what the tools say of one compiled .cu file.
type Object struct {
	File      string             // the source, "gemm.cu"
	Resources PerArch[Resources] // cuobjdump --dump-resource-usage
	Threads   PerArch[int]       // cuobjdump -elf: EIATTR_MAX_THREADS
	Demangled map[string]string  // mangled name -> c++filt's
	DynUsers  map[string]bool    // mangled names whose PTX uses dynamic shared memory
	DynSmem   map[string]int     // kernel name (template name) -> LSP_DYN_SMEM_BYTES
}

// Kernels gathers an object's kernels. Every kernel needs launch bounds
// (they give the threads per block) and, when it uses dynamic shared
// memory, the constant of its launcher. nvcc 11.8's sm_90 cubins count
// the system's 1 KiB reservation in the shared memory of every kernel that
// uses any (ptxas -v gives the kernel's own figure, 1 KiB less); it is
// taken off here, and Theoretical adds it on every architecture.
func (o Object) Kernels() ([]*Kernel, error) {
	byName := map[string]*Kernel{}
	for arch, fns := range o.Resources {
		a, ok := ArchByName(arch)
		if !ok {
			return nil, fmt.Errorf("%s: a cubin for %s, an architecture the report does not know", o.File, arch)
		}
		for fn, r := range fns {
			k := byName[fn]
			if k == nil {
				d, ok := o.Demangled[fn]
				if !ok {
					return nil, fmt.Errorf("%s: %s was not demangled", o.File, fn)
				}
				k = &Kernel{File: o.File, Mangled: fn, Arch: map[string]*ArchInfo{}}
				k.Name, k.Base = ShortName(d)
				if o.DynUsers[fn] {
					n, ok := o.DynSmem[k.Base]
					if !ok {
						return nil, fmt.Errorf("%s: %s uses dynamic shared memory but the file has no LSP_DYN_SMEM_BYTES(%s, ...)", o.File, k.Name, k.Base)
					}
					k.DynSmem = n
				}
				byName[fn] = k
			}
			threads, ok := o.Threads[arch][fn]
			if !ok {
				return nil, fmt.Errorf("%s: %s on %s has no __launch_bounds__, which the report takes as its block size", o.File, k.Name, arch)
			}
			if a.Name == "sm_90" && r.Shared > 0 {
				if r.Shared < reservedSmem {
					return nil, fmt.Errorf("%s: %s on sm_90 has %d bytes of shared memory, less than the 1 KiB reservation "+
						"sm_90 cubins have added so far: the toolkit changed, check how", o.File, k.Name, r.Shared)
				}
				r.Shared -= reservedSmem
			}
			occ, err := Theoretical(a, r.Regs, threads, r.Shared+k.DynSmem)
			if err != nil {
				return nil, fmt.Errorf("%s: %s on %s: %w", o.File, k.Name, arch, err)
			}
			k.Arch[arch] = &ArchInfo{Resources: r, Threads: threads, Occ: occ}
		}
	}
	for base := range o.DynSmem {
		used := false
		for _, k := range byName {
			used = used || (k.Base == base && k.DynSmem > 0)
		}
		if !used {
			return nil, fmt.Errorf("%s: LSP_DYN_SMEM_BYTES(%s, ...) names no kernel that uses dynamic shared memory", o.File, base)
		}
	}
	out := make([]*Kernel, 0, len(byName))
	for _, k := range byName {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Stacked lists, by architecture, the mangled names of the kernels with a
// stack frame or .local memory: the only ones that can spill, so the only
// ones ptxas is asked about.
func Stacked(kernels []*Kernel) map[string][]string {
	out := map[string][]string{}
	for _, k := range kernels {
		for arch, a := range k.Arch {
			if a.Stack > 0 || a.Local > 0 {
				out[arch] = append(out[arch], k.Mangled)
			}
		}
	}
	for _, fns := range out {
		sort.Strings(fns)
	}
	return out
}

// SetSpills records ptxas's figures for one architecture, after checking
// that its code is the build's: the same registers and stack frame.
func SetSpills(kernels []*Kernel, arch string, spills map[string]Spill) error {
	for _, k := range kernels {
		a := k.Arch[arch]
		if a == nil || (a.Stack == 0 && a.Local == 0) {
			continue
		}
		s, ok := spills[k.Mangled]
		if !ok {
			return fmt.Errorf("%s on %s: ptxas did not compile it", k.Name, arch)
		}
		if s.Regs != a.Regs || s.Stack != a.Stack+a.Local {
			return fmt.Errorf("%s on %s: ptxas gives %d registers and %d bytes of stack, the build %d and %d: "+
				"the PTX compiled again is not the build's (are the nvcc flags the Makefile's?)", k.Name, arch, s.Regs, s.Stack, a.Regs, a.Stack+a.Local)
		}
		a.Spill = s
	}
	return nil
}

// SetSASS records one cubin's disassembly.
func SetSASS(kernels []*Kernel, arch string, sass map[string]SASS) error {
	for _, k := range kernels {
		a := k.Arch[arch]
		if a == nil {
			continue
		}
		s, ok := sass[k.Mangled]
		if !ok {
			return fmt.Errorf("%s on %s: not in the disassembly (%s)", k.Name, arch, strings.Join(keys(sass), ", "))
		}
		a.SASS = &s
	}
	return nil
}

func keys[T any](m map[string]T) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
