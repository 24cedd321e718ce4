// Package device opens the compute backend a configuration names (--device
// and its settings): the one place that knows which backends this build
// has, so every job (training, evaluation, sampling, compare) gets its
// backend the same way and a new backend is added here only.
//
// It also knows what storage each backend can train in: the CUDA kernels
// of GEMM and attention take bf16 only (backend.KernelDTypes), so --device
// cuda defaults to --dtype bf16 and refuses fp32, while the CPU backend
// takes either and defaults to fp32.
//
// Limits: this build has the CPU backend only; --device cuda is a known
// name that Open refuses, with a message saying so, until the CUDA backend
// lands.
package device

import (
	"fmt"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// Kind names a backend (--device).
type Kind string

// Backends a configuration may name.
const (
	CPU  Kind = "cpu"
	CUDA Kind = "cuda"
)

// Config is what a backend is opened with.
type Config struct {
	Kind      Kind   // --device
	MemBudget int64  // --device-mem: device memory budget in bytes (0: unlimited)
	Threads   int    // --threads: compute threads (0: all cores)
	Seed      uint64 // --seed: seeds the backend's own randomness (the CPU backend's test delays)
	// LinkBandwidth charges every device-host copy at this many bytes/s on
	// a backend whose link is simulated (the CPU's); 0: copies are free.
	LinkBandwidth int64
}

// opener builds one backend from c.
type opener func(c Config) (backend.Backend, error)

// built are the backends of this build; a known Kind missing here is
// refused as not built.
var built = map[Kind]opener{
	CPU: func(c Config) (backend.Backend, error) {
		return cpu.New(cpu.Config{MemBudget: c.MemBudget, Threads: c.Threads, Seed: c.Seed,
			LinkBandwidth: float64(c.LinkBandwidth)}), nil
	},
}

// ParseKind reads a --device value: a backend name, built or not.
func ParseKind(s string) (Kind, error) {
	switch k := Kind(s); k {
	case CPU, CUDA:
		return k, nil
	}
	return "", fmt.Errorf("unknown device %q (want cpu or cuda)", s)
}

// String is the flag spelling.
func (k Kind) String() string { return string(k) }

// Set parses a --device value (flag.Value).
func (k *Kind) Set(s string) error {
	v, err := ParseKind(s)
	if err != nil {
		return err
	}
	*k = v
	return nil
}

// DefaultDType is the storage type of weights and activations on k when
// --dtype is not given: bf16 on cuda, fp32 on the CPU.
func (k Kind) DefaultDType() backend.DType {
	if k == CUDA {
		return backend.BF16
	}
	return backend.F32
}

// modelOps are the ops whose inputs are the model's weights and
// activations in its storage type: a backend that refuses the storage type
// for one of them cannot train the model.
var modelOps = []struct{ op, arg string }{{"Gemm", "A"}, {"AttentionForward", "qkv"}}

// CheckDType says whether models stored in dt train on k: nil, or why not,
// naming the ops whose kernels refuse dt.
func CheckDType(k Kind, dt backend.DType) error {
	if k != CUDA {
		return nil // the CPU backend computes every op in fp32 and bf16
	}
	var refused []string
	for _, m := range modelOps {
		if !backend.Accepts(m.op, m.arg, dt) {
			refused = append(refused, m.op)
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("the CUDA kernels of %s take no %v input; train in bf16 (the default on cuda)", strings.Join(refused, " and "), dt)
	}
	return nil
}

// Check says whether this build can open k: nil, or why not.
func Check(k Kind) error {
	if _, err := ParseKind(string(k)); err != nil {
		return err
	}
	if built[k] == nil {
		return fmt.Errorf("%q is not available in this build (cpu only; cuda comes with the CUDA backend)", string(k))
	}
	return nil
}

// Open returns the backend c names; the caller closes it.
func Open(c Config) (backend.Backend, error) {
	if err := Check(c.Kind); err != nil {
		return nil, err
	}
	return built[c.Kind](c)
}
