// Package kreport is the static report of the compiled kernels
// (kernels/cmd/kreport, `make kernel-report`): what cuobjdump, nvdisasm and
// ptxas say about each kernel of build/libkernels.a on each architecture
// (registers, stack frame, spills, shared memory, threads per block), the
// theoretical occupancy that follows, the tensor-core instructions in the
// inner loops, and the rules a kernel must pass. The parsers take the
// tools' text, so they are tested on saved output without a toolkit.
package kreport

import "fmt"

// Arch is one architecture's per-SM limits, as CUDA's occupancy calculator
// uses them (cuda_occupancy.h of CUDA 11.8: cudaOccMaxBlocksPerMultiprocessor,
// cudaOccRegAllocationGranularity, cudaOccSMemAllocationGranularity; the
// per-SM figures are the programming guide's "Technical Specifications per
// Compute Capability").
type Arch struct {
	Name         string // "sm_80"
	MaxThreads   int    // resident threads per SM
	MaxBlocks    int    // resident blocks per SM
	SmemPerSM    int    // bytes of shared memory per SM at the largest carveout
	SmemPerBlock int    // bytes one block may use (with the opt-in attribute)
}

// The register file, its allocation and the shared memory reservation are
// the same on every architecture here (compute capability 8.x and 9.0).
const (
	regsPerSM        = 64 * 1024 // 32-bit registers per SM
	regsPerBlock     = 64 * 1024 // the most one block may hold
	subPartitions    = 4         // registers are allocated per quarter SM
	regGranularity   = 256       // registers per warp are rounded up to this
	smemGranularity  = 128       // shared memory per block is rounded up to this
	reservedSmem     = 1024      // bytes per block the system keeps (sm_80 and newer)
	warpSize         = 32
	maxRegsPerThread = 255
)

// Arches are the architectures `make kernels` builds for.
var Arches = []Arch{
	{Name: "sm_80", MaxThreads: 2048, MaxBlocks: 32, SmemPerSM: 164 << 10, SmemPerBlock: 163 << 10},
	{Name: "sm_86", MaxThreads: 1536, MaxBlocks: 16, SmemPerSM: 100 << 10, SmemPerBlock: 99 << 10},
	{Name: "sm_89", MaxThreads: 1536, MaxBlocks: 24, SmemPerSM: 100 << 10, SmemPerBlock: 99 << 10},
	{Name: "sm_90", MaxThreads: 2048, MaxBlocks: 32, SmemPerSM: 228 << 10, SmemPerBlock: 227 << 10},
}

// ArchByName finds one of Arches.
func ArchByName(name string) (Arch, bool) {
	for _, a := range Arches {
		if a.Name == name {
			return a, true
		}
	}
	return Arch{}, false
}

// Occupancy is the theoretical occupancy of a kernel on one architecture.
type Occupancy struct {
	Blocks  int     // resident blocks per SM
	Warps   int     // resident warps per SM
	Ratio   float64 // Warps over the SM's maximum
	Limiter string  // what bounds Blocks: "warps", "blocks", "regs" (registers) or "smem" (shared memory)
}

// Theoretical computes the occupancy of blocks of threads threads, each
// thread holding regs registers, each block smem bytes of shared memory
// (static plus dynamic; the system's reservation is added here), as
// cudaOccMaxActiveBlocksPerMultiprocessor does with partitioned global
// caching off and the largest shared memory carveout.
func Theoretical(a Arch, regs, threads, smem int) (Occupancy, error) {
	if threads < 1 || threads > 1024 || regs < 0 || smem < 0 {
		return Occupancy{}, fmt.Errorf("occupancy: %d threads, %d registers, %d bytes of shared memory: out of range", threads, regs, smem)
	}
	if regs > maxRegsPerThread {
		return Occupancy{}, fmt.Errorf("occupancy: %d registers a thread, more than %d", regs, maxRegsPerThread)
	}
	warps := ceilDiv(threads, warpSize)
	maxWarps := a.MaxThreads / warpSize

	o := Occupancy{Blocks: maxWarps / warps, Limiter: "warps"}
	if a.MaxBlocks < o.Blocks {
		o.Blocks, o.Limiter = a.MaxBlocks, "blocks"
	}

	// Registers go to warps, in units of 256, and warps to the SM's four
	// sub-partitions; the hardware checks a block as if it used all four.
	if regs > 0 {
		perWarp := roundUp(regs*warpSize, regGranularity)
		if perWarp*roundUp(warps, subPartitions) > regsPerBlock {
			return Occupancy{}, fmt.Errorf("occupancy: %d threads of %d registers exceed a block's %d registers", threads, regs, regsPerBlock)
		}
		byRegs := (regsPerSM / subPartitions / perWarp) * subPartitions / warps
		if byRegs < o.Blocks {
			o.Blocks, o.Limiter = byRegs, "regs"
		}
	}

	perBlock := roundUp(smem+reservedSmem, smemGranularity)
	if perBlock > a.SmemPerBlock+reservedSmem {
		return Occupancy{}, fmt.Errorf("occupancy: %d bytes of shared memory a block, more than %s allows", smem, a.Name)
	}
	if bySmem := a.SmemPerSM / perBlock; bySmem < o.Blocks {
		o.Blocks, o.Limiter = bySmem, "smem"
	}

	o.Warps = o.Blocks * warps
	o.Ratio = float64(o.Warps) / float64(maxWarps)
	return o, nil
}

// String is the occupancy as a whole percentage with what limits it, e.g.
// "25% (registers)".
func (o Occupancy) String() string {
	return fmt.Sprintf("%d%% (%s)", int(o.Ratio*100+0.5), o.Limiter)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func roundUp(a, b int) int { return ceilDiv(a, b) * b }
