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
// --device cuda (device 0) or cuda:N opens the CUDA backend (package
// cuda) in a build with the tag cuda (a GPU) or cudasim (the simulated
// CUDA runtime): cuda.go adds it. Without either tag cuda is a known name
// that Open refuses, saying how to build it; on a machine without a
// usable device Open says that no device was found.
package device

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/flagerr"
)

// Kind names a backend (--device): cpu, cuda (device 0), or cuda:N.
type Kind string

// Backends a configuration may name.
const (
	CPU  Kind = "cpu"
	CUDA Kind = "cuda"
)

// Base is the backend without a device number: CUDA for cuda:N.
func (k Kind) Base() Kind {
	if strings.HasPrefix(string(k), string(CUDA)+":") {
		return CUDA
	}
	return k
}

// Ordinal is the device number of cuda:N (0 for cuda, and for cpu).
func (k Kind) Ordinal() int {
	_, n, ok := strings.Cut(string(k), ":")
	if !ok {
		return 0
	}
	i, err := strconv.Atoi(n)
	if err != nil {
		return 0
	}
	return i
}

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

// ParseKind reads a --device value: a backend name, built or not, and for
// cuda an optional device number (cuda:N).
func ParseKind(s string) (Kind, error) {
	switch k := Kind(s); k {
	case CPU, CUDA:
		return k, nil
	}
	if n, ok := strings.CutPrefix(s, string(CUDA)+":"); ok {
		if i, err := strconv.Atoi(n); err != nil || i < 0 || strconv.Itoa(i) != n {
			return "", fmt.Errorf("device %q: want cuda:N with N a device number (0, 1, ...)", s)
		}
		return Kind(s), nil
	}
	return "", fmt.Errorf("unknown device %q (want cpu or cuda, or cuda:N for device N)", s)
}

// String is the flag spelling.
func (k Kind) String() string { return string(k) }

// Set parses a --device value (flag.Value).
func (k *Kind) Set(s string) error { return flagerr.Set(k, ParseKind, s) }

// DefaultDType is the storage type of weights and activations on k when
// --dtype is not given: bf16 on cuda, fp32 on the CPU.
func (k Kind) DefaultDType() backend.DType {
	if k.Base() == CUDA {
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
	if k.Base() != CUDA {
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
	if built[k.Base()] == nil {
		return fmt.Errorf("%q is not available in this build (cpu only: `make` builds with CUDA where nvcc is installed, "+
			"`go build -tags cuda` after `make kernels`, or -tags cudasim for the simulated runtime)", string(k))
	}
	return nil
}

// Comm is a communicator between the devices of several ranks, on device
// tensors, enqueued on the backend's streams (engine.DeviceComm): NCCL on
// the CUDA backend.
type Comm interface {
	Rank() int
	Size() int
	AllReduceSum(s backend.Stream, t, scratch backend.Tensor) error
	Stats() comm.Stats
	Close() error
}

// newComm, per backend kind that has one, joins the ranks of a host
// communicator in a device communicator.
var newComm = map[Kind]func(be backend.Backend, c comm.Communicator) (Comm, error){}

// NewComm joins the ranks of c, each with its backend be of kind k, in a
// device communicator; every rank must call it. A backend without one
// (the CPU backend, whose device memory is the host's) gives
// ErrNoDeviceComm.
func NewComm(k Kind, be backend.Backend, c comm.Communicator) (Comm, error) {
	f := newComm[k.Base()]
	if f == nil {
		return nil, fmt.Errorf("%w: the %s backend", ErrNoDeviceComm, k.Base())
	}
	return f(be, c)
}

// perRank, per backend kind with devices to share out, is PerRank's
// choice for that kind.
var perRank = map[Kind]func(localRank int) (Kind, error){}

// PerRank is the device that the rank of a data-parallel job numbered
// localRank among those on its machine (OMPI_COMM_WORLD_LOCAL_RANK) uses
// for --device k: with cuda, its own GPU, cuda:localRank; k itself when
// it names a device (cuda:N, given per rank) or has none (cpu).
func PerRank(k Kind, localRank int) (Kind, error) {
	f := perRank[k]
	if f == nil || localRank < 0 {
		return k, nil
	}
	return f(localRank)
}

// ErrNoDeviceComm says that a backend has no device communicator.
var ErrNoDeviceComm = errors.New("no device communicator")

// Built lists the backends of this build, for help texts.
func Built() []Kind {
	var ks []Kind
	for _, k := range []Kind{CPU, CUDA} {
		if built[k] != nil {
			ks = append(ks, k)
		}
	}
	return ks
}

// Open returns the backend c names; the caller closes it.
func Open(c Config) (backend.Backend, error) {
	if err := Check(c.Kind); err != nil {
		return nil, err
	}
	return built[c.Kind.Base()](c)
}
