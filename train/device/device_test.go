// Tests of the backend constructor: cpu opens with its settings, cuda is
// refused with a message that says why, and an unknown name is refused at
// the flag.

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
		{CUDA, "not available in this build"},
		{"tpu", `unknown device "tpu"`},
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
	if err := k.Set("cuda"); err != nil || k != CUDA || k.String() != "cuda" {
		t.Errorf("Set(cuda): %v, %q", err, k)
	}
	if err := k.Set("gpu"); err == nil || k != CUDA {
		t.Errorf("Set(gpu) = %v and left %q; want an error and cuda kept", err, k)
	}
}

func TestDefaultDType(t *testing.T) {
	if CUDA.DefaultDType() != backend.BF16 || CPU.DefaultDType() != backend.F32 {
		t.Errorf("default dtypes: cuda %v, cpu %v; want bf16 and fp32", CUDA.DefaultDType(), CPU.DefaultDType())
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
