//go:build cuda

// The GPU build: the runtime is CUDA's own (linked statically by package
// kernels), which keeps no message beyond the error code.

package cuda

import (
	"math"
	"time"
)

// simulated says which runtime this build has.
const simulated = false

// maxDefaultArena does not cap the arena of a backend without a budget on
// a GPU: it takes the free memory less backend.DeviceHeadroom.
const maxDefaultArena = math.MaxInt64

// lastMessage is "": CUDA's errors carry only their code.
func lastMessage() string { return "" }

// simSetDelays does nothing on a GPU, whose streams keep their own timing.
func simSetDelays(seed uint64, maxMicros uint) {}

// SetHazardDelays does nothing on a GPU and reports false: see the
// simulated build's.
func SetHazardDelays(seed uint64, max time.Duration) bool { return false }
