// Command kreport is the static report of the compiled kernels (`make
// kernel-report`; see package kernels/internal/kreport for the rules): for
// each kernel of build/kernels/*.o and each architecture, registers, stack
// frame, spills, shared memory, threads per block, theoretical occupancy
// and the tensor-core instructions in its loops, as a markdown table. It
// fails, saying why, on a kernel that breaks a rule, and on a README whose
// table is not the one it generates (-update rewrites it).
//
//	go run ./kernels/cmd/kreport -nvcc /usr/bin/nvcc -nvcc-flags "-std=c++17 -O3 -Ikernels" [-update]
//
// The toolkit's own tools do the reading: cuobjdump (resources, launch
// bounds, PTX), c++filt (names), nvdisasm (SASS of the files that claim
// tensor cores or spill) and, for the kernels with a stack frame only (the only ones
// that can spill), nvcc -ptx and ptxas -v, with the build's flags.
package main

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/lsp-offload/lsp-offload/kernels/internal/kreport"
)

func main() {
	var c config
	flag.StringVar(&c.objs, "objs", "build/kernels", "the folder of the compiled kernels (*.o)")
	flag.StringVar(&c.src, "src", "kernels", "the folder of their sources (*.cu)")
	flag.StringVar(&c.nvcc, "nvcc", "nvcc", "nvcc; cuobjdump, nvdisasm and ptxas are taken from its folder")
	flag.StringVar(&c.nvccFlags, "nvcc-flags", "-std=c++17 -O3 -Ikernels", "the build's nvcc flags, less the architectures (for the PTX of kernels with a stack frame)")
	flag.StringVar(&c.readme, "readme", "README.md", "the README whose table is checked (or rewritten with -update)")
	flag.StringVar(&c.out, "o", "build/kernel-report.md", "where the table is written too")
	flag.BoolVar(&c.update, "update", false, "rewrite the README's table instead of checking it")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "kreport:", err)
		os.Exit(1)
	}
}

type config struct {
	objs, src, nvcc, nvccFlags, readme, out string
	update                                  bool
}

// errRules marks a report whose kernels break a rule (already printed).
var errRules = errors.New("kernels break the report's rules (above)")

func run(c config) error {
	objs, err := filepath.Glob(filepath.Join(c.objs, "*.o"))
	if err != nil || len(objs) == 0 {
		return fmt.Errorf("no compiled kernels in %s (run make kernels)", c.objs)
	}
	nvcc, err := exec.LookPath(c.nvcc)
	if err != nil {
		return err
	}
	t := tools{dir: filepath.Dir(nvcc), nvcc: nvcc, flags: strings.Fields(c.nvccFlags)}

	// One object per goroutine, as many at a time as there are CPUs: the
	// disassembly of gemm.o and attention.o is most of the time.
	type result struct {
		kernels []*kreport.Kernel
		claims  []kreport.Claim
		err     error
	}
	results := make([]result, len(objs))
	sem := make(chan struct{}, runtime.NumCPU())
	var wg sync.WaitGroup
	for i, obj := range objs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			r := &results[i]
			r.kernels, r.claims, r.err = t.object(obj, c.src)
		}()
	}
	wg.Wait()
	var kernels []*kreport.Kernel
	var claims []kreport.Claim
	for i, r := range results {
		if r.err != nil {
			return fmt.Errorf("%s: %w", objs[i], r.err)
		}
		kernels = append(kernels, r.kernels...)
		claims = append(claims, r.claims...)
	}

	table := kreport.Markdown(kernels)
	if err := os.WriteFile(c.out, []byte(table), 0o644); err != nil {
		return err
	}
	fmt.Print(table[:strings.Index(table, "\n|")+1])
	fmt.Printf("kreport: the table of %d kernels is in %s\n", len(kernels), c.out)
	if bad := kreport.Check(kernels, claims); len(bad) > 0 {
		for _, b := range bad {
			fmt.Println("kreport: FAIL:", b)
		}
		return errRules
	}
	return syncReadme(c.readme, t.version(), table, c.update)
}

// tools runs the toolkit's programs.
type tools struct {
	dir, nvcc string
	flags     []string
}

func (t tools) run(dir string, name string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(t.dir, name), args...)
	cmd.Dir = dir
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	// ptxas -v writes its information to stderr.
	return out.String() + stderr.String(), nil
}

// version is nvcc's line naming its release, "Cuda compilation tools,
// release 11.8, V11.8.89".
func (t tools) version() string {
	out, err := exec.Command(t.nvcc, "--version").Output()
	if err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "release") {
				return strings.TrimSpace(line)
			}
		}
	}
	return "nvcc (version unknown)"
}

// object reads one compiled .cu file and the claims of its source.
func (t tools) object(obj, srcDir string) ([]*kreport.Kernel, []kreport.Claim, error) {
	file := strings.TrimSuffix(filepath.Base(obj), ".o") + ".cu"
	src, err := os.ReadFile(filepath.Join(srcDir, file))
	if err != nil {
		return nil, nil, err
	}
	claims, err := kreport.ParseClaims(file, src)
	if err != nil {
		return nil, nil, err
	}
	o := kreport.Object{File: file}
	text, err := t.run("", "cuobjdump", "--dump-resource-usage", obj)
	if err != nil {
		return nil, nil, err
	}
	if o.Resources, err = kreport.ParseResourceUsage(text); err != nil {
		return nil, nil, err
	}
	if text, err = t.run("", "cuobjdump", "-elf", obj); err != nil {
		return nil, nil, err
	}
	if o.Threads, err = kreport.ParseMaxThreads(text); err != nil {
		return nil, nil, err
	}
	// The PTX in the object is compute_90's; which kernels touch dynamic
	// shared memory does not depend on the architecture.
	if text, err = t.run("", "cuobjdump", "-ptx", obj); err != nil {
		return nil, nil, err
	}
	o.DynUsers = kreport.DynamicSmemUsers(text)
	if o.DynSmem, err = dynSmem(obj); err != nil {
		return nil, nil, err
	}
	if o.Demangled, err = t.demangle(o.Resources); err != nil {
		return nil, nil, err
	}
	kernels, err := o.Kernels()
	if err != nil {
		return nil, nil, err
	}
	if err := t.spills(kernels, filepath.Join(srcDir, file)); err != nil {
		return nil, nil, err
	}
	// The SASS, where a claim of tensor cores is to be checked or a spill
	// located.
	for _, c := range claims {
		if c.Kind == kreport.ClaimTensorCores {
			return kernels, claims, t.sass(kernels, obj)
		}
	}
	for _, k := range kernels {
		for _, a := range k.Arch {
			if a.Spill.Stores+a.Spill.Loads > 0 {
				return kernels, claims, t.sass(kernels, obj)
			}
		}
	}
	return kernels, claims, nil
}

// demangle names every function with c++filt (binutils, there wherever
// cgo builds), in one call; CUDA's cu++filt writes template arguments less
// readably ("(bool)0" for false).
func (t tools) demangle(res kreport.PerArch[kreport.Resources]) (map[string]string, error) {
	seen := map[string]bool{}
	var names []string
	for _, fns := range res {
		for fn := range fns {
			if !seen[fn] {
				seen[fn] = true
				names = append(names, fn)
			}
		}
	}
	sort.Strings(names)
	cmd := exec.Command("c++filt")
	cmd.Stdin = strings.NewReader(strings.Join(names, "\n") + "\n")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("c++filt: %w", err)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(names) {
		return nil, fmt.Errorf("c++filt: %d names in, %d out", len(names), len(lines))
	}
	m := map[string]string{}
	for i, n := range names {
		m[n] = lines[i]
	}
	return m, nil
}

// dynSmem reads the LSP_DYN_SMEM_BYTES constants of an object's host code.
func dynSmem(obj string) (map[string]int, error) {
	f, err := elf.Open(obj)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return nil, fmt.Errorf("host symbols: %w", err)
	}
	out := map[string]int{}
	for _, s := range syms {
		base, ok := strings.CutPrefix(s.Name, kreport.DynSmemPrefix)
		if !ok || s.Section == elf.SHN_UNDEF || int(s.Section) >= len(f.Sections) {
			continue
		}
		if s.Size != 4 {
			return nil, fmt.Errorf("%s: %d bytes, want an unsigned int", s.Name, s.Size)
		}
		data, err := f.Sections[s.Section].Data()
		if err != nil || s.Value+4 > uint64(len(data)) {
			return nil, fmt.Errorf("%s: cannot read its value: %v", s.Name, err)
		}
		out[base] = int(binary.LittleEndian.Uint32(data[s.Value:]))
	}
	return out, nil
}

// spills asks ptxas about the kernels with a stack frame, architecture by
// architecture, compiling the source to that architecture's PTX as the
// build did (nvcc -ptx is a second or two; ptxas only for those entries).
func (t tools) spills(kernels []*kreport.Kernel, src string) error {
	stacked := kreport.Stacked(kernels)
	if len(stacked) == 0 {
		return nil
	}
	tmp, err := os.MkdirTemp("", "kreport-ptx-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for arch, fns := range stacked {
		ptx := filepath.Join(tmp, arch+".ptx")
		virtual := "compute_" + strings.TrimPrefix(arch, "sm_")
		args := append(append([]string{}, t.flags...), "-arch="+virtual, "-ptx", src, "-o", ptx)
		if _, err := t.run("", "nvcc", args...); err != nil {
			return err
		}
		args = []string{"-v", "-arch=" + arch, ptx, "-o", filepath.Join(tmp, arch+".cubin")}
		for _, fn := range fns {
			args = append(args, "-e", fn)
		}
		text, err := t.run("", "ptxas", args...)
		if err != nil {
			return err
		}
		spills, err := kreport.ParsePtxas(text)
		if err != nil {
			return err
		}
		if err := kreport.SetSpills(kernels, arch, spills); err != nil {
			return err
		}
	}
	return nil
}

var cubinName = regexp.MustCompile(`\.(sm_\d+)\.cubin$`)

// sass disassembles every cubin of an object.
func (t tools) sass(kernels []*kreport.Kernel, obj string) error {
	tmp, err := os.MkdirTemp("", "kreport-sass-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	abs, err := filepath.Abs(obj)
	if err != nil {
		return err
	}
	if _, err := t.run(tmp, "cuobjdump", "-xelf", "all", abs); err != nil {
		return err
	}
	cubins, err := filepath.Glob(filepath.Join(tmp, "*.cubin"))
	if err != nil || len(cubins) == 0 {
		return fmt.Errorf("cuobjdump -xelf all %s: no cubin", obj)
	}
	for _, cubin := range cubins {
		m := cubinName.FindStringSubmatch(cubin)
		if m == nil {
			return fmt.Errorf("%s: no architecture in the name", cubin)
		}
		text, err := t.run("", "nvdisasm", cubin)
		if err != nil {
			return err
		}
		sass, err := kreport.ParseSASS(text)
		if err != nil {
			return err
		}
		if err := kreport.SetSASS(kernels, m[1], sass); err != nil {
			return err
		}
	}
	return nil
}

// syncReadme checks (or, with update, rewrites) the README's table.
func syncReadme(path, version, table string, update bool) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	now, err := kreport.Splice(string(old), version, table)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case now == string(old):
		fmt.Printf("kreport: %s has this table\n", path)
		return nil
	case update:
		if err := os.WriteFile(path, []byte(now), 0o644); err != nil {
			return err
		}
		fmt.Printf("kreport: wrote the table into %s\n", path)
		return nil
	}
	return fmt.Errorf("%s: its kernel table is not this build's; make kernel-report UPDATE=1 rewrites it (the new table is in build/kernel-report.md)", path)
}
