// Tests of the backend constructor: cpu opens with its settings, an
// unknown name is refused at the flag, cuda:N parses. Whether cuda opens
// depends on the build: refused_test.go (no CUDA) and cuda_test.go.

package device

import (
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

func TestOpenCPU(t *testing.T) {
	be, err := Open(Config{Kind: CPU, MemBudget: 1 << 20, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if got := be.MemStats().Budget; got != 1<<20 {
		t.Errorf("memory budget %d, want %d", got, 1<<20)
	}
}

func TestOpenRefused(t *testing.T) {
	for _, tc := range []struct {
		kind Kind
		want string
	}{
		{"tpu", `unknown device "tpu"`},
		{"cuda:x", `device "cuda:x": want cuda:N`},
		{"", "unknown device"},
	} {
		be, err := Open(Config{Kind: tc.kind})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q) = %v, %v; want an error saying %q", tc.kind, be, err, tc.want)
		}
		if err := Check(tc.kind); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%q) = %v; want an error saying %q", tc.kind, err, tc.want)
		}
	}
}

func TestKindFlag(t *testing.T) {
	var k Kind
	if err := k.Set("cuda"); err != nil || k != CUDA || k.String() != "cuda" || k.Ordinal() != 0 || k.Base() != CUDA {
		t.Errorf("Set(cuda): %v, %q", err, k)
	}
	if err := k.Set("gpu"); err == nil || k != CUDA {
		t.Errorf("Set(gpu) = %v and left %q; want an error and cuda kept", err, k)
	}
	if err := k.Set("cuda:3"); err != nil || k.Base() != CUDA || k.Ordinal() != 3 || k.String() != "cuda:3" {
		t.Errorf("Set(cuda:3): %v, %q (base %q, ordinal %d)", err, k, k.Base(), k.Ordinal())
	}
	for _, bad := range []string{"cuda:", "cuda:-1", "cuda:01", "cuda:x", "cuda:1:2", "cpu:0", "cuda0"} {
		if err := k.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	if CPU.Base() != CPU || CPU.Ordinal() != 0 {
		t.Errorf("cpu: base %q, ordinal %d", CPU.Base(), CPU.Ordinal())
	}
}

func TestDefaultDType(t *testing.T) {
	if CUDA.DefaultDType() != backend.BF16 || CPU.DefaultDType() != backend.F32 {
		t.Errorf("default dtypes: cuda %v, cpu %v; want bf16 and fp32", CUDA.DefaultDType(), CPU.DefaultDType())
	}
	if Kind("cuda:1").DefaultDType() != backend.BF16 || CheckDType("cuda:1", backend.F32) == nil {
		t.Errorf("cuda:1 defaults to %v and takes fp32: want bf16 and a refusal, as cuda", Kind("cuda:1").DefaultDType())
	}
	for _, k := range []Kind{CPU, CUDA} {
		if err := CheckDType(k, k.DefaultDType()); err != nil {
			t.Errorf("%s refuses its own default dtype: %v", k, err)
		}
	}
	if err := CheckDType(CPU, backend.BF16); err != nil {
		t.Errorf("cpu refuses bf16: %v", err)
	}
	err := CheckDType(CUDA, backend.F32)
	if err == nil || !strings.Contains(err.Error(), "Gemm and AttentionForward") || !strings.Contains(err.Error(), "fp32") {
		t.Errorf("cuda with fp32: %v; want an error naming Gemm, AttentionForward and fp32", err)
	}
}

// TestPerRankCPU: the CPU backend has no devices to share out.
func TestPerRankCPU(t *testing.T) {
	if got, err := PerRank(CPU, 2); err != nil || got != CPU {
		t.Errorf("PerRank(cpu, 2) = %s, %v; want cpu", got, err)
	}
}
