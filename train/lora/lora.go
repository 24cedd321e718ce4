// Package lora is LoRA (Hu et al., 2021) as PEFT defines it, the fourth
// update mode (docs/DESIGN.md, "The update modes"): each targeted block
// matrix W keeps its weights frozen and gains a trainable low-rank term,
//
//	y = W x + (alpha / r) B A x,   A: r x in,  B: out x r,
//
// with PEFT's names (lora_A.weight, lora_B.weight), shapes and
// initialisation (A Kaiming-uniform with a = sqrt(5), B zero), so that
// adapters go to and come from `peft.PeftModel` unchanged.
//
// This file holds what the mode and the adapter files share: the
// configuration (--lora-r, --lora-alpha, --lora-dropout, --lora-targets)
// and the sites, the matrices an adapter is attached to.
package lora

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// Config is the adapters' shape.
type Config struct {
	R       int     // rank r (--lora-r)
	Alpha   float64 // alpha (--lora-alpha); the term is scaled by Alpha / R
	Dropout float64 // dropout on the adapter's input (--lora-dropout)
	// Targets are Hugging Face module names, each matching every module
	// whose path ends with it as PEFT matches a plain name: "c_proj" is
	// both GPT-2's attn.c_proj and its mlp.c_proj. Empty: the family's
	// default (DefaultTargets).
	Targets []string
	// Base stores every block matrix quantized (--base-dtype nf4 or
	// int8: QLoRA's frozen base, train/quant); 0 keeps them in the model
	// dtype.
	Base backend.QFormat
}

// ParseBaseDType reads --base-dtype: nf4 or int8, or "" for the model's
// dtype (0).
func ParseBaseDType(s string) (backend.QFormat, error) {
	switch s {
	case "":
		return 0, nil
	case "nf4":
		return backend.NF4, nil
	case "int8":
		return backend.Int8, nil
	}
	return 0, fmt.Errorf("--base-dtype: unknown %q (want nf4 or int8, or leave it out for the model's --dtype)", s)
}

// Defaults: PEFT's own rank and alpha are 8 and 8; 16 is the alpha most
// recipes pair with r 8 (the and the README's choice).
const (
	DefaultR     = 8
	DefaultAlpha = 16
)

// DefaultTargets are every attention and MLP linear of a family.
func DefaultTargets(family string) []string {
	switch family {
	case "gpt2":
		return []string{"c_attn", "c_proj", "c_fc"}
	default: // llama and its relatives (Qwen2)
		return []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
	}
}

// ParseTargets reads --lora-targets: comma-separated module names, blanks
// around them ignored ("": none, the family's default).
func ParseTargets(s string) []string {
	var names []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// WithDefaultTargets is c with empty Targets set to the family's
// default, the family being arch's (a model.Spec's Family); an arch
// without one keeps c as it is.
func (c Config) WithDefaultTargets(arch any) Config {
	if f, ok := arch.(interface{ Family() string }); ok && len(c.Targets) == 0 {
		c.Targets = DefaultTargets(f.Family())
	}
	return c
}

// Scale is alpha / r, the factor of the low-rank term.
func (c Config) Scale() float32 { return float32(c.Alpha / float64(c.R)) }

// Validate checks the values, naming the flag at fault.
func (c Config) Validate() error {
	var errs []error
	if c.R < 1 {
		errs = append(errs, fmt.Errorf("--lora-r: %d must be at least 1", c.R))
	}
	if !(c.Alpha > 0) || math.IsInf(c.Alpha, 0) {
		errs = append(errs, fmt.Errorf("--lora-alpha: %g must be a positive number", c.Alpha))
	}
	if !(c.Dropout >= 0 && c.Dropout < 1) {
		errs = append(errs, fmt.Errorf("--lora-dropout: %g must be in [0, 1)", c.Dropout))
	}
	if c.Base != 0 && c.Base != backend.NF4 && c.Base != backend.Int8 {
		errs = append(errs, fmt.Errorf("--base-dtype: unknown format %v", c.Base))
	}
	for _, t := range c.Targets {
		if t == "" || strings.ContainsAny(t, "*?[]()|^$\\ ") {
			errs = append(errs, fmt.Errorf("--lora-targets: %q is not a module name (a name such as q_proj; patterns are not supported)", t))
		}
	}
	return errors.Join(errs...)
}

// Site is one adapted matrix: matrix K of block Layer.
type Site struct {
	Layer, K int
	// Module is the Hugging Face module path, e.g.
	// "transformer.h.0.attn.c_proj" or "model.layers.0.self_attn.q_proj":
	// the matrix parameter's name without ".weight".
	Module string
	M, N   int // in, out (A is R x M, B is N x R)
	// FanInFanOut: the checkpoint stores the base weight in x out (GPT-2's
	// Conv1D), PEFT's fan_in_fan_out.
	FanInFanOut bool
}

// Sites lists the matrices of idx that c's targets name, by block, then
// in forward order. A target that names no module is an error naming it.
func Sites(idx *model.Index, c Config) ([]Site, error) {
	targets := c.Targets
	used := make([]bool, len(targets))
	var sites []Site
	for l := range idx.MatParam {
		for k, pi := range idx.MatParam[l] {
			p := idx.Layout[pi]
			mod, ok := strings.CutSuffix(p.Name, ".weight")
			if !ok {
				return nil, fmt.Errorf("lora: matrix %s is not a module's weight", p.Name)
			}
			hit := false
			for i, t := range targets {
				if matches(mod, t) {
					used[i], hit = true, true
				}
			}
			if !hit {
				continue
			}
			m := idx.Mats[k]
			sites = append(sites, Site{Layer: l, K: k, Module: mod, M: m.M, N: m.N, FanInFanOut: !p.Transposed})
		}
	}
	var missing []string
	for i, t := range targets {
		if !used[i] {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("--lora-targets: the model has no module %s (its block matrices: %s)",
			strings.Join(missing, ", "), strings.Join(matrixModules(idx), ", "))
	}
	if len(sites) == 0 {
		return nil, errors.New("--lora-targets: no module to adapt")
	}
	return sites, nil
}

// matrixModules are the last names of block 0's matrices, for messages.
func matrixModules(idx *model.Index) []string {
	var names []string
	for _, pi := range idx.MatParam[0] {
		mod := strings.TrimSuffix(idx.Layout[pi].Name, ".weight")
		name := mod[strings.LastIndex(mod, ".")+1:]
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}
