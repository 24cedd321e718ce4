package kreport

import (
	"os"
	"testing"
)

// The testdata files are real output of CUDA 11.8's tools (trimmed where
// noted) for adam.cu as it was before its grid-stride loop stopped being
// unrolled (adamw_kernel<false, false> then spilled on sm_90), built for
// sm_80 and sm_90, and for gemm.cu.

const (
	adamw00 = "_ZN44_GLOBAL__N__8ae1ab17_11_adam_old_cu_5b218ac312adamw_kernelILb0ELb0EEEvPvPfPKvS2_S2_PKfS6_xNS_11AdamScalarsE"
	adamw01 = "_ZN44_GLOBAL__N__8ae1ab17_11_adam_old_cu_5b218ac312adamw_kernelILb0ELb1EEEvPvPfPKvS2_S2_PKfS6_xNS_11AdamScalarsE"
	flag    = "_ZN44_GLOBAL__N__8ae1ab17_11_adam_old_cu_5b218ac322non_finite_flag_kernelEPfPKfx"
	gemmNN  = "_ZN39_GLOBAL__N__1e816e25_7_gemm_cu_ee07c82d19gemm_bf16_nn_kernelENS_10GemmParamsE"
	ropeBF  = "_ZN39_GLOBAL__N__d73885f6_7_rope_cu_bc77d9ba11rope_kernelI13__nv_bfloat16EEvPT_PKS2_PKiPKfxiiif"
)

func testdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// resource-usage.txt: cuobjdump --dump-resource-usage, whole.
func TestParseResourceUsage(t *testing.T) {
	res, err := ParseResourceUsage(testdata(t, "resource-usage.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || len(res["sm_80"]) != 5 || len(res["sm_90"]) != 5 {
		t.Fatalf("got %d architectures (%d, %d functions), want sm_80 and sm_90 with 5 each", len(res), len(res["sm_80"]), len(res["sm_90"]))
	}
	for _, c := range []struct {
		arch, fn string
		want     Resources
	}{
		{"sm_80", adamw00, Resources{Regs: 41}},
		{"sm_90", adamw00, Resources{Regs: 39, Stack: 8}},
		{"sm_90", flag, Resources{Regs: 28}},
	} {
		if got := res[c.arch][c.fn]; got != c.want {
			t.Errorf("%s %s: got %+v, want %+v", c.arch, c.fn, got, c.want)
		}
	}
	if _, err := ParseResourceUsage("Fatbin elf code:\n"); err == nil {
		t.Error("no cubin: want an error")
	}
	if _, err := ParseResourceUsage("arch = sm_80\n Function f:\n  REG:3 STACK:0\n"); err == nil {
		t.Error("a line without SHARED and LOCAL: want an error")
	}
}

// elf.txt: cuobjdump -elf, the .nv.info section of each kernel only.
func TestParseMaxThreads(t *testing.T) {
	th, err := ParseMaxThreads(testdata(t, "elf.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range []string{"sm_80", "sm_90"} {
		if th[arch][adamw00] != 256 || th[arch][adamw01] != 256 || th[arch][flag] != 1024 {
			t.Errorf("%s: got %v, want 256 for adamw_kernel and 1024 for non_finite_flag_kernel", arch, th[arch])
		}
	}
}

// ptxas.txt: ptxas -v -arch=sm_90 of the object's PTX, whole.
func TestParsePtxas(t *testing.T) {
	sp, err := ParsePtxas(testdata(t, "ptxas.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(sp) != 5 {
		t.Errorf("got %d entries, want 5", len(sp))
	}
	if got, want := sp[adamw00], (Spill{Regs: 39, Stack: 8, Stores: 16, Loads: 24}); got != want {
		t.Errorf("adamw_kernel<false, false>: got %+v, want %+v", got, want)
	}
	if got, want := sp[adamw01], (Spill{Regs: 38}); got != want {
		t.Errorf("adamw_kernel<false, true>: got %+v, want %+v", got, want)
	}
	if _, err := ParsePtxas("ptxas info    : Compiling entry function 'f' for 'sm_90'\n"); err == nil {
		t.Error("an entry without registers: want an error")
	}
}

// ptx.txt: lines of gemm.cu's and rope.cu's PTX (compute_90).
func TestDynamicSmemUsers(t *testing.T) {
	users := DynamicSmemUsers(testdata(t, "ptx.txt"))
	if !users[gemmNN] || users[ropeBF] || len(users) != 1 {
		t.Errorf("got %v, want only gemm_bf16_nn_kernel", users)
	}
}

// sass-*.txt: nvdisasm of the sm_90 cubin, one kernel's section, only its
// labels, branches, exits and the counted instructions kept.
func TestParseSASS(t *testing.T) {
	s, err := ParseSASS(testdata(t, "sass-gemm.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s[gemmNN], (SASS{HMMA: 32, HMMAInLoops: 32}); got != want {
		t.Errorf("gemm_bf16_nn_kernel: got %+v, want %+v", got, want)
	}
	// adamw's spill: 5 loads and stores, all next to its loops.
	if s, err = ParseSASS(testdata(t, "sass-adamw.txt")); err != nil {
		t.Fatal(err)
	}
	if got, want := s[adamw00], (SASS{Local: 5}); got != want {
		t.Errorf("adamw_kernel<false, false>: got %+v, want %+v", got, want)
	}

	// Two nested loops (the inner one 0x30..0x50), a store in the outer
	// only, a load and an HMMA in the inner one, a forward branch.
	const nested = `.text.k:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   STL [R1], R0 ;
        /*0020*/              @P0 BRA ` + "`(.L_x_2)" + ` ;
.L_x_1:
        /*0030*/                   LDL R0, [R1] ;
        /*0040*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0050*/              @P1 BRA ` + "`(.L_x_1)" + ` ;
.L_x_2:
        /*0060*/              @P2 BRA ` + "`(.L_x_0)" + ` ;
        /*0070*/                   EXIT ;
`
	if s, err = ParseSASS(nested); err != nil {
		t.Fatal(err)
	}
	if got, want := s["k"], (SASS{HMMA: 1, HMMAInLoops: 1, Local: 2, LocalInLoops: 2, LocalInInner: 1}); got != want {
		t.Errorf("nested loops: got %+v, want %+v", got, want)
	}
	if _, err := ParseSASS(".text.k:\n        /*0000*/   BRA `(.L_x_9) ;\n"); err == nil {
		t.Error("a branch to a missing label: want an error")
	}
}
