package engine

import (
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
)

// twoRanks claims a world of two; only Validate looks at it.
type twoRanks struct{ *comm.Single }

func (twoRanks) Size() int { return 2 }

// TestDataParallelRefuses: with several ranks, what dp.go does not support
// is refused naming its flag; one rank (comm.Single) is no restriction.
func TestDataParallelRefuses(t *testing.T) {
	ok := testConfig(LSP)
	ok.DenseParams, ok.LSP.NoFit = DenseHost, true
	ok.Comm = twoRanks{comm.NewSingle()}
	if err := ok.Validate(); err != nil {
		t.Fatalf("lsp, --dense-params host, random projectors, 2 ranks: %v", err)
	}
	native := ok
	native.Mode = Native
	if err := native.Validate(); err != nil {
		t.Fatalf("native, fp32 gradients, 2 ranks: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Mode, c.GradDType = Native, backend.BF16 }, "--grad-dtype bf16"},
		{func(c *Config) { c.Mode = Zero }, "--mode zero"},
		{func(c *Config) { c.DenseParams = DenseDevice }, "--dense-params device"},
		{func(c *Config) { c.LSP.NoFit = false }, "--fit"},
		{func(c *Config) { c.GradDType = backend.BF16 }, "--grad-dtype bf16"},
	} {
		c := ok
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error naming %q, got %v", tc.want, err)
		}
		c.Comm = comm.NewSingle()
		if err := c.Validate(); err != nil && strings.Contains(err.Error(), "ranks") {
			t.Errorf("one rank: %v", err)
		}
	}
}
