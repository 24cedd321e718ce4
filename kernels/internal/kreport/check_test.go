package kreport

import (
	"strings"
	"testing"
)

func TestShortName(t *testing.T) {
	for _, c := range []struct{ in, name, base string }{
		{"void (anonymous namespace)::adamw_kernel<false, false>(void*, float*, (anonymous namespace)::AdamScalars)", "adamw_kernel<false, false>", "adamw_kernel"},
		{"(anonymous namespace)::non_finite_flag_kernel(float*, float const*, long long)", "non_finite_flag_kernel", "non_finite_flag_kernel"},
		{"void <unnamed>::rope_kernel<(bool)0>(float *)", "rope_kernel<(bool)0>", "rope_kernel"},
	} {
		if name, base := ShortName(c.in); name != c.name || base != c.base {
			t.Errorf("ShortName(%q) = %q, %q; want %q, %q", c.in, name, base, c.name, c.base)
		}
	}
}

func TestParseClaims(t *testing.T) {
	src := `/*
 * rope.cu: ...
 * stack frame (rope_kernel): sincosf's reduction of large angles.
 * tensor cores (gemm_a, attn<64, 2>, b<1>):
 * runs on tensor cores (bf16 in, fp32 accumulate), not a claim.
 */
// 255 registers (attn<128>): the accumulators.
`
	claims, err := ParseClaims("x.cu", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(claims) != 3 {
		t.Fatalf("got %d claims, want 3: %+v", len(claims), claims)
	}
	if c := claims[0]; c.Kind != ClaimStack || c.Kernels[0] != "rope_kernel" || c.Reason != "sincosf's reduction of large angles." || c.Line != 3 {
		t.Errorf("stack frame: got %+v", c)
	}
	if c := claims[1]; c.Kind != ClaimTensorCores || strings.Join(c.Kernels, "|") != "gemm_a|attn<64, 2>|b<1>" {
		t.Errorf("tensor cores: got %+v", c)
	}
	if c := claims[2]; c.Kind != ClaimRegs || c.Kernels[0] != "attn<128>" {
		t.Errorf("255 registers: got %+v", c)
	}
	for _, bad := range []string{
		"// stack frame (rope_kernel):\n",                     // no reason
		"// spills (k):   */\n",                               // no reason either
		"// tensor cores (gemm_a, gemm_b,\n// gemm_c): ...\n", // cut across lines
	} {
		if _, err := ParseClaims("x.cu", []byte(bad)); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

// kernel builds a kernel compiled for sm_80 and sm_90 alike.
func kernel(name string, a ArchInfo) *Kernel {
	n, base := ShortName(name)
	k := &Kernel{File: "x.cu", Mangled: name, Name: n, Base: base, Arch: map[string]*ArchInfo{}}
	for _, arch := range []string{"sm_80", "sm_90"} {
		c := a
		k.Arch[arch] = &c
	}
	return k
}

func TestCheck(t *testing.T) {
	plain := ArchInfo{Resources: Resources{Regs: 32}, Threads: 256, SASS: &SASS{}}
	stacked := plain
	stacked.Stack = 32
	spilled := stacked
	spilled.Spill = Spill{Regs: 32, Stack: 32, Stores: 4, Loads: 4}
	spilledInner := spilled
	spilledInner.SASS = &SASS{Local: 2, LocalInLoops: 2, LocalInInner: 1}
	wide := plain
	wide.Regs = 255
	mma := plain
	mma.SASS = &SASS{HMMA: 8, HMMAInLoops: 8}
	claim := func(kind, name string) Claim {
		return Claim{Kind: kind, Kernels: []string{name}, Reason: "why", File: "x.cu", Line: 1}
	}

	cases := []struct {
		name    string
		kernels []*Kernel
		claims  []Claim
		fails   []string // a part of each failure, in order
	}{
		{"plain passes", []*Kernel{kernel("f", plain)}, nil, nil},
		{"stack frame without a reason", []*Kernel{kernel("f", stacked)}, nil,
			[]string{"f (x.cu) on sm_80: 32 bytes of stack frame", "on sm_90: 32 bytes of stack frame"}},
		{"stack frame with a reason", []*Kernel{kernel("f", stacked)}, []Claim{claim(ClaimStack, "f")}, nil},
		{"the template's name covers its instantiations", []*Kernel{kernel("void g<1>(int)", stacked)}, []Claim{claim(ClaimStack, "g")}, nil},
		{"another instantiation's reason does not", []*Kernel{kernel("void g<1>(int)", stacked)}, []Claim{claim(ClaimStack, "g<2>")},
			[]string{"g<1> (x.cu) on sm_80", "g<1> (x.cu) on sm_90", "stack frame (g<2>): no such kernel"}},
		{"a spill fails", []*Kernel{kernel("f", spilled)}, []Claim{claim(ClaimStack, "f")},
			[]string{"on sm_80: 4 bytes of spill stores", "on sm_90: 4 bytes of spill stores"}},
		{"a spill with a reason, outside innermost loops", []*Kernel{kernel("f", spilled)}, []Claim{claim(ClaimSpills, "f")}, nil},
		{"a spill in an innermost loop fails even so", []*Kernel{kernel("f", spilledInner)}, []Claim{claim(ClaimSpills, "f")},
			[]string{"1 local loads or stores of spills in an innermost loop", "in an innermost loop"}},
		{"255 registers", []*Kernel{kernel("f", wide)}, nil, []string{"255 registers and no line", "255 registers and no line"}},
		{"255 registers with a reason", []*Kernel{kernel("f", wide)}, []Claim{claim(ClaimRegs, "f")}, nil},
		{"a stale reason", []*Kernel{kernel("f", plain)}, []Claim{claim(ClaimRegs, "f")}, []string{"no longer so on any architecture"}},
		{"tensor cores", []*Kernel{kernel("f", mma)}, []Claim{claim(ClaimTensorCores, "f")}, nil},
		{"tensor cores without HMMA in a loop", []*Kernel{kernel("f", plain)}, []Claim{claim(ClaimTensorCores, "f")},
			[]string{"f on sm_80 has no HMMA in a loop", "f on sm_90 has no HMMA in a loop"}},
	}
	for _, c := range cases {
		got := Check(c.kernels, c.claims)
		if len(got) != len(c.fails) {
			t.Errorf("%s: got %d failures, want %d:\n%s", c.name, len(got), len(c.fails), strings.Join(got, "\n"))
			continue
		}
		for i, want := range c.fails {
			if !strings.Contains(got[i], want) {
				t.Errorf("%s: failure %d is %q, want it to contain %q", c.name, i, got[i], want)
			}
		}
	}
}

func TestKernels(t *testing.T) {
	res, err := ParseResourceUsage(testdata(t, "resource-usage.txt"))
	if err != nil {
		t.Fatal(err)
	}
	th, err := ParseMaxThreads(testdata(t, "elf.txt"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, fns := range res {
		for fn := range fns {
			names[fn] = "void (anonymous namespace)::k" + fn[len(fn)-12:] + "(int)"
		}
	}
	names[adamw00] = "void (anonymous namespace)::adamw_kernel<false, false>(void*)"
	o := Object{File: "adam.cu", Resources: res, Threads: th, Demangled: names}
	ks, err := o.Kernels()
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) != 5 {
		t.Fatalf("got %d kernels, want 5", len(ks))
	}
	var k *Kernel
	for _, x := range ks {
		if x.Name == "adamw_kernel<false, false>" {
			k = x
		}
	}
	if k == nil || k.Arch["sm_90"].Stack != 8 || k.Arch["sm_90"].Threads != 256 {
		t.Fatalf("adamw_kernel<false, false>: got %+v", k)
	}
	// 39 registers = 1248 -> 1280 a warp: 12 warps a sub-partition, 48 an
	// SM, 6 blocks of 8 warps: 75% on sm_90.
	if got := k.Arch["sm_90"].Occ.String(); got != "75% (regs)" {
		t.Errorf("occupancy on sm_90: got %s, want 75%% (regs)", got)
	}
	if got := Stacked(ks); len(got) != 1 || len(got["sm_90"]) != 1 || got["sm_90"][0] != adamw00 {
		t.Errorf("Stacked: got %v, want adamw_kernel<false, false> on sm_90", got)
	}
	if err := SetSpills(ks, "sm_90", map[string]Spill{adamw00: {Regs: 40, Stack: 8}}); err == nil {
		t.Error("ptxas's registers differ from the build's: want an error")
	}

	// A kernel that uses dynamic shared memory needs its launcher's constant.
	o.DynUsers = map[string]bool{adamw00: true}
	if _, err := o.Kernels(); err == nil {
		t.Error("dynamic shared memory without LSP_DYN_SMEM_BYTES: want an error")
	}
	o.DynSmem = map[string]int{"adamw_kernel": 4096}
	if ks, err = o.Kernels(); err != nil {
		t.Fatal(err)
	}
	for _, x := range ks {
		if x.Mangled == adamw00 && x.DynSmem != 4096 {
			t.Errorf("dynamic shared memory: got %d, want 4096", x.DynSmem)
		}
	}
	o.DynSmem["gone_kernel"] = 1
	if _, err := o.Kernels(); err == nil {
		t.Error("LSP_DYN_SMEM_BYTES of no kernel: want an error")
	}
}

func TestMarkdownAndSplice(t *testing.T) {
	plain := ArchInfo{Resources: Resources{Regs: 32}, Threads: 256}
	k := kernel("f", plain)
	k.Arch["sm_90"].Regs = 40
	k.Arch["sm_90"].Stack = 8
	table := Markdown([]*Kernel{k})
	for _, want := range []string{
		"- Spills: none.",
		"- Stack frames: `f` (8 B on sm_90).",
		"- Most registers: 40 (`f`).",
		"| `f` | x.cu | 256 | 32 / - / - / 40 | 0 / - / - / 8 | 0 | 0 + 0 |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	readme := "# R\n\ntext\n\n" + BeginMarker + "\nold\n" + EndMarker + "\n\nmore\n"
	got, err := Splice(readme, "nvcc 11.8", "TABLE\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# R\n\ntext\n\n" + BeginMarker + "\n\nCompiled by nvcc 11.8.\n\nTABLE\n\n" + EndMarker + "\n\nmore\n"; got != want {
		t.Errorf("Splice: got\n%s\nwant\n%s", got, want)
	}
	if again, _ := Splice(got, "nvcc 11.8", "TABLE\n"); again != got {
		t.Error("Splice is not idempotent")
	}
	if _, err := Splice("# R\n", "v", "T"); err == nil {
		t.Error("a README without the markers: want an error")
	}
}
