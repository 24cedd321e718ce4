// Package plan predicts a training step's time on a machine: the engine's
// own step graph (engine.TraceStep on a train/trace backend) is costed op
// by op against a Machine and simulated event by event (Simulate), giving
// the step time, each queue's busy time, the critical path and the overlap
// achieved, and a timeline PNG.
//
// The cost model (cost.go): a device op takes max(FLOPs/(peak*eff),
// bytes/(bandwidth*eff)) plus a launch overhead, eff its family's
// efficiency; a copy across the link takes latency + bytes/bandwidth of
// its direction; a host Adam node takes its bytes (engine.HostWork) over
// the host pool's Adam bandwidth. The presets' peaks and bandwidths are
// vendor figures (cited beside each); the efficiencies are assumptions, the
// same for every GPU, that a calibration (measured per-op times) should
// replace.
//
// The CPU backend is a Machine too, built from train/calibrate's
// microbenchmarks alone (FromCalibration, cpu.go): GPU.SharesHost set
// (compute, copies and host Adam contend for the cores, at the measured
// shared/alone rates; see sim.go), PeakF32 and PeakBF16 the GEMM peak and
// MemBW the triad bandwidth measured, Launch the per-op overhead, Sync and
// Event the schedule's overheads, Measured the calibration's per-op times
// at the ops' shapes, and Link the measured copies plus the backend's
// --link-bandwidth charge (cpu.Config's LinkBandwidth and LinkLatency).
// MeasuredOps prices ops from a real run timed by events instead, on any
// backend.
package plan

import (
	"fmt"
	"sort"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// Machine is what a step runs on: a device, its link to the host, the host.
type Machine struct {
	GPU  GPU
	Link Link
	Host Host
	// Ranks is how many such machines (one GPU and one process each)
	// train together by data parallelism, over Net; 0 or 1: one.
	Ranks int
	Net   Net
}

// GPU describes the device.
type GPU struct {
	Name   string
	Memory int64 // bytes: the card's
	// Context is the device memory the CUDA context takes before the run
	// allocates anything (the driver's state, the loaded kernels); an
	// assumption per preset until a GPU measures it (cudaContext).
	Context int64
	// DeviceMem is the --device-mem budget the run is given (the backend's
	// arena is exactly it); 0: the card's memory less Context and the
	// backend's headroom (Budget).
	DeviceMem int64
	// PeakF32 is the fp32 FLOP/s of the ordinary cores (no tensor cores:
	// the engine's fp32 GEMMs do not ask for TF32); PeakBF16 the dense
	// bf16 tensor-core FLOP/s with fp32 accumulation, which bf16 GEMMs and
	// attention run at. Every other op computes in fp32.
	PeakF32, PeakBF16 float64
	MemBW             float64 // device memory bytes/s
	// Eff is the fraction of peak (FLOPs or bandwidth, whichever binds) an
	// op family achieves; a family absent from the map is 1.
	Eff map[trace.Family]float64
	// Launch is the fixed time of each op (kernel launch and tail), s.
	Launch float64
	// SharesHost: compute runs on the host's cores (the CPU backend), so
	// it contends with host Adam for them; ComputeThreads is the number of
	// threads compute uses (0: every core).
	SharesHost     bool
	ComputeThreads int
	// Sync is what a Synchronize after a node adds (the sequential
	// schedule waits for each device node), and Event what an event
	// record and wait adds per dependency across queues (the pipelined
	// schedule), s; 0 on the GPU presets.
	Sync, Event float64
	// Contention: see Resources.Contention (nil: the thread-count rule).
	Contention map[[2]Bound]float64
	// Measured, when set, gives an op's time alone from measurements
	// (a calibration's table, by method and shapes); ok false falls back
	// to the peak-and-efficiency model. Copies across the link are always
	// the Link's.
	Measured func(o trace.Op) (seconds float64, ok bool)
}

// Link is the host-device interconnect.
type Link struct {
	Name     string
	H2D, D2H float64 // bytes/s each way (full duplex: the two directions do not share)
	Latency  float64 // s per copy
}

// Budget is the device memory a run on g may allocate: --device-mem when
// given, otherwise what the CUDA backend's arena takes, the free memory
// (the card less its context) less backend.DeviceHeadroom. A CPU
// "device" (SharesHost) is its memory.
func (g GPU) Budget() int64 {
	switch {
	case g.DeviceMem > 0:
		return g.DeviceMem
	case g.SharesHost:
		return g.Memory
	}
	free := g.Memory - g.Context
	return free - backend.DeviceHeadroom(free)
}

// Host is the CPU side.
type Host struct {
	Name   string
	Cores  int
	MemBW  float64 // bytes/s, every channel together
	Memory int64   // bytes
	// Workers is the host Adam pool's size (0: Cores). Each worker streams
	// at most CoreBW bytes/s, and the pool together at most
	// MemBW*AdamBWFraction: host Adam is bandwidth bound.
	Workers        int
	CoreBW         float64
	AdamBWFraction float64
	// AdamOverhead is the fixed time of one host Adam node (waking the
	// pool, splitting the tensors), s.
	AdamOverhead float64
}

// workers is the pool size.
func (h Host) workers() int {
	if h.Workers > 0 {
		return h.Workers
	}
	return max(h.Cores, 1)
}

// AdamRate is the bytes/s the host Adam pool streams.
func (h Host) AdamRate() float64 {
	r := h.MemBW * h.AdamBWFraction
	if h.CoreBW > 0 {
		r = min(r, float64(h.workers())*h.CoreBW)
	}
	return r
}

// Validate checks that every rate is positive, naming the field.
func (m Machine) Validate() error {
	var bad []string
	pos := func(name string, v float64) {
		if !(v > 0) {
			bad = append(bad, fmt.Sprintf("%s = %g", name, v))
		}
	}
	pos("gpu peak fp32", m.GPU.PeakF32)
	pos("gpu peak bf16", m.GPU.PeakBF16)
	pos("gpu memory bandwidth", m.GPU.MemBW)
	pos("link h2d bandwidth", m.Link.H2D)
	pos("link d2h bandwidth", m.Link.D2H)
	pos("host memory bandwidth", m.Host.MemBW)
	pos("host adam bandwidth fraction", m.Host.AdamBWFraction)
	if m.Host.Cores < 1 {
		bad = append(bad, fmt.Sprintf("host cores = %d", m.Host.Cores))
	}
	if m.Ranks > 1 {
		pos("network bandwidth", m.Net.Bandwidth)
		if m.Net.Latency < 0 {
			bad = append(bad, fmt.Sprintf("network latency = %g", m.Net.Latency))
		}
	}
	for f, e := range m.GPU.Eff {
		if !(e > 0 && e <= 1) {
			bad = append(bad, fmt.Sprintf("efficiency of %s = %g (want (0, 1])", f, e))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("plan: machine %s: %s", m.GPU.Name, strings.Join(bad, ", "))
	}
	return nil
}

const (
	gb  = 1e9
	gib = 1 << 30
	tf  = 1e12
)

// gpuEff is the assumed efficiency of each family on a GPU: GEMMs at large
// shapes reach most of the tensor-core peak, the bandwidth-bound families
// most of the memory bandwidth, and LSP's sparse ops (gathers by index)
// much less, as do the dense projectors' fp32 products (ordinary cores
// at the fp32 peak, a multiply and an add apiece: no FMA). Assumptions,
// not measurements.
func gpuEff() map[trace.Family]float64 {
	return map[trace.Family]float64{
		trace.Gemm: 0.7, trace.Attention: 0.5, trace.Norm: 0.7, trace.Activation: 0.8,
		trace.Elementwise: 0.8, trace.Sparse: 0.25, trace.Dense: 0.25, trace.Embedding: 0.5, trace.Loss: 0.6,
		trace.Adam: 0.8, trace.Reduce: 0.6, trace.Copy: 0.8,
	}
}

// gpuLaunch is a CUDA kernel's launch overhead, about 5 us.
const gpuLaunch = 5e-6

// cudaContext is the device memory taken by a CUDA context with lazy
// module loading (CUDA 11.7 on) before any allocation: an assumption
// (nvidia-smi commonly shows 250 to 500 MiB for a process that has only
// initialised CUDA and cuBLAS), the same for every preset, until the GPU
// bundle measures it on a card.
const cudaContext = 400 << 20

// GPUs are the device presets, by --gpu name.
var GPUs = map[string]GPU{
	// NVIDIA Ada GPU Architecture whitepaper v2.1, appendix table "GeForce
	// RTX 4090": 24 GB GDDR6X, 1008 GB/s, 82.6 TFLOPS fp32, 165.2 TFLOPS
	// dense fp16/bf16 tensor with fp32 accumulate.
	// https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf
	"rtx4090": {Name: "NVIDIA GeForce RTX 4090 24 GB", Memory: 24 * gib, PeakF32: 82.6 * tf, PeakBF16: 165.2 * tf, MemBW: 1008 * gb},
	// NVIDIA GeForce RTX 4060 Ti 16 GB (AD106, a 16 GB desktop card):
	// 34 SMs, 4352 CUDA cores at 2535 MHz boost, 16 GB GDDR6 on 128 bits
	// (NVIDIA's RTX 4060 family specifications,
	// https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4060-4060ti/);
	// 18 Gbps x 128 bits = 288 GB/s and a PCIe 4.0 x8 link (third-party
	// spec tables and reviews; NVIDIA's page gives neither). fp32 = 4352
	// x 2 x 2.535 GHz = 22.06 TFLOPS. The Ada whitepaper has no table for
	// this card, so bf16 is the RTX 4090's rate per SM and clock from the
	// table above: 165.2 TFLOPS / (128 SMs x 2.52 GHz) = 512 dense flops
	// of bf16 tensor with fp32 accumulate, so 34 x 2.535 GHz x 512 = 44.1
	// TFLOPS. (The 88 TFLOPS sometimes quoted is fp16 accumulate, which
	// GeForce runs at twice the fp32-accumulate rate and training does
	// not use.) Derived figures, not datasheet ones.
	"rtx4060ti-16gb": {Name: "NVIDIA GeForce RTX 4060 Ti 16 GB", Memory: 16 * gib, PeakF32: 22.06 * tf, PeakBF16: 44.1 * tf, MemBW: 288 * gb},
	// NVIDIA RTX A1000 Laptop GPU (GA107, the paper's 4 GB laptop GPU):
	// 2048 CUDA cores and 64 tensor cores at up to 1680 MHz boost (NVIDIA
	// RTX professional laptop GPU line card,
	// https://www.nvidia.com/en-us/design-visualization/laptop-gpus/):
	// fp32 = 2048 x 2 x 1.68 GHz = 6.9 TFLOPS; bf16 tensor with fp32
	// accumulate, dense, 4x that on GA10x professional parts (the RTX
	// A6000 datasheet: 38.7 TFLOPS fp32, 154.8 dense tensor) = 27.5
	// TFLOPS. Memory: 4 GB
	// GDDR6, 128-bit at 11 Gbps = 176 GB/s (third-party spec tables; the
	// line card gives only the size). Derived figures, not datasheet ones.
	"a1000-laptop": {Name: "NVIDIA RTX A1000 Laptop 4 GB", Memory: 4 * gib, PeakF32: 6.9 * tf, PeakBF16: 27.5 * tf, MemBW: 176 * gb},
	// NVIDIA A100 Tensor Core GPU datasheet (SXM): 19.5 TFLOPS fp32, 312
	// TFLOPS bf16 tensor (dense); 40 GB HBM2 at 1555 GB/s, 80 GB HBM2e at
	// 2039 GB/s. https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
	"a100-40gb": {Name: "NVIDIA A100 40 GB SXM", Memory: 40 * gib, PeakF32: 19.5 * tf, PeakBF16: 312 * tf, MemBW: 1555 * gb},
	"a100-80gb": {Name: "NVIDIA A100 80 GB SXM", Memory: 80 * gib, PeakF32: 19.5 * tf, PeakBF16: 312 * tf, MemBW: 2039 * gb},
	// NVIDIA H100 Tensor Core GPU datasheet (SXM5): 67 TFLOPS fp32, 989
	// TFLOPS bf16 tensor dense (1979 with sparsity), 80 GB HBM3 at 3.35
	// TB/s. https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
	"h100": {Name: "NVIDIA H100 80 GB SXM", Memory: 80 * gib, PeakF32: 67 * tf, PeakBF16: 989 * tf, MemBW: 3350 * gb},
	// NVIDIA H200 Tensor Core GPU product brief (SXM): 141 GB HBM3e at 4.8
	// TB/s, 67 TFLOPS fp32, 989 TFLOPS bf16 tensor dense (1979 with
	// sparsity). https://www.nvidia.com/en-us/data-center/h200/ The 141 GB
	// are decimal: nvidia-smi reports 143771 MiB (third-party reports),
	// taken here.
	"h200": {Name: "NVIDIA H200 141 GB SXM", Memory: 143771 << 20, PeakF32: 67 * tf, PeakBF16: 989 * tf, MemBW: 4800 * gb},
	// NVIDIA Ampere GA102 GPU architecture whitepaper v2, table "GeForce
	// RTX 3090": 24 GB GDDR6X at 936 GB/s, 35.6 TFLOPS fp32, 71 TFLOPS
	// dense fp16/bf16 tensor with fp32 accumulate (GeForce runs fp32
	// accumulate at half the fp16-accumulate rate).
	// https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf
	"rtx3090": {Name: "NVIDIA GeForce RTX 3090 24 GB", Memory: 24 * gib, PeakF32: 35.6 * tf, PeakBF16: 71 * tf, MemBW: 936 * gb},
	// NVIDIA GeForce RTX 3060 12 GB (GA106): 3584 CUDA cores at 1.777 GHz
	// boost, 12 GB GDDR6 on 192 bits at 15 Gbps = 360 GB/s (NVIDIA's RTX
	// 3060 family specifications,
	// https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3060-3060ti/);
	// fp32 = 3584 x 2 x 1.777 GHz = 12.7 TFLOPS. bf16: the RTX 3090's
	// rate per SM and clock from the GA102 table above, 71 TFLOPS / (82
	// SMs x 1.695 GHz) = 511 flops, so 28 SMs x 1.777 GHz x 511 = 25.4
	// TFLOPS. Derived figures, not datasheet ones.
	"rtx3060": {Name: "NVIDIA GeForce RTX 3060 12 GB", Memory: 12 * gib, PeakF32: 12.7 * tf, PeakBF16: 25.4 * tf, MemBW: 360 * gb},
	// NVIDIA GeForce RTX 4060 8 GB (AD107): 3072 CUDA cores at 2.46 GHz
	// boost, 24 SMs, 8 GB GDDR6 on 128 bits at 17 Gbps = 272 GB/s, PCIe
	// 4.0 x8 (NVIDIA's RTX 4060 family specifications, as for the 4060
	// Ti above; bus and link from third-party tables); fp32 = 3072 x 2 x
	// 2.46 GHz = 15.1 TFLOPS; bf16 at the Ada rate per SM and clock
	// derived for the 4060 Ti, 24 x 2.46 GHz x 512 = 30.2 TFLOPS.
	// Derived figures, not datasheet ones.
	"rtx4060": {Name: "NVIDIA GeForce RTX 4060 8 GB", Memory: 8 * gib, PeakF32: 15.1 * tf, PeakBF16: 30.2 * tf, MemBW: 272 * gb},
	// Ada whitepaper v2.1 (as for the RTX 4090), table "GeForce RTX
	// 4080": 16 GB GDDR6X at 716.8 GB/s, 48.7 TFLOPS fp32, 97.5 TFLOPS
	// dense fp16/bf16 tensor with fp32 accumulate.
	"rtx4080": {Name: "NVIDIA GeForce RTX 4080 16 GB", Memory: 16 * gib, PeakF32: 48.7 * tf, PeakBF16: 97.5 * tf, MemBW: 716.8 * gb},
	// NVIDIA L4 Tensor Core GPU datasheet: 24 GB GDDR6 at 300 GB/s, 30.3
	// TFLOPS fp32, 121 TFLOPS bf16 tensor dense (242 with sparsity), PCIe
	// 4.0 x16. https://www.nvidia.com/en-us/data-center/l4/
	"l4": {Name: "NVIDIA L4 24 GB", Memory: 24 * gib, PeakF32: 30.3 * tf, PeakBF16: 121 * tf, MemBW: 300 * gb},
	// NVIDIA A10 Tensor Core GPU datasheet: 24 GB GDDR6 at 600 GB/s, 31.2
	// TFLOPS fp32, 125 TFLOPS bf16 tensor dense (250 with sparsity), PCIe
	// 4.0 x16. https://www.nvidia.com/en-us/data-center/products/a10-gpu/
	"a10": {Name: "NVIDIA A10 24 GB", Memory: 24 * gib, PeakF32: 31.2 * tf, PeakBF16: 125 * tf, MemBW: 600 * gb},
}

// GPUName is the preset name --gpu spelled as name means: the preset
// whose name it is once both are lower-cased and stripped of everything
// but letters and digits, with or without the maker's words (nvidia,
// geforce, rtx, tesla) in front ("4090", "RTX4090", "rtx-4090",
// "GeForce RTX 4090" are rtx4090), or else the one preset it begins
// (rtx4060ti for rtx4060ti-16gb). Otherwise it returns the presets the
// name begins, none or several.
func GPUName(name string) (preset string, matches []string) {
	bare := func(s string) string {
		s = strings.Map(func(r rune) rune {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
				return r
			case r >= 'A' && r <= 'Z':
				return r + 'a' - 'A'
			}
			return -1
		}, s)
		for _, w := range []string{"nvidia", "geforce", "tesla", "rtx"} {
			s = strings.TrimPrefix(s, w)
		}
		return s
	}
	want := bare(name)
	if want == "" {
		return "", nil
	}
	var prefixed []string
	for key := range GPUs {
		b := bare(key)
		if b == want {
			return key, nil
		}
		if strings.HasPrefix(b, want) {
			prefixed = append(prefixed, key)
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0], nil
	}
	sort.Strings(prefixed)
	return "", prefixed
}

// Links are the interconnect presets, by --link name. PCIe x16 moves, per
// direction, 16 lanes x the transfer rate x 128/130 (gen3 on: 128b/130b
// encoding): gen3 8 GT/s = 15.75 GB/s, gen4 16 GT/s = 31.5 GB/s, gen5 32
// GT/s = 63 GB/s (PCI-SIG, PCI Express Base Specification 3.0/4.0/5.0).
// The "-peak" presets are those theoretical figures; the plain names are
// what pinned cudaMemcpyAsync typically reaches after packet and protocol
// overhead, taken as 80% of them (an assumption: NVIDIA's bandwidthTest
// commonly reports 12-13, 25-26 and 50-53 GB/s). Latency: 10 us per copy
// (an assumption: DMA set-up and the copy's launch).
var Links = map[string]Link{
	"pcie3":      {Name: "PCIe 3.0 x16 (80% of 15.75 GB/s)", H2D: 0.8 * 15.75 * gb, D2H: 0.8 * 15.75 * gb, Latency: 10e-6},
	"pcie4":      {Name: "PCIe 4.0 x16 (80% of 31.5 GB/s)", H2D: 0.8 * 31.5 * gb, D2H: 0.8 * 31.5 * gb, Latency: 10e-6},
	"pcie5":      {Name: "PCIe 5.0 x16 (80% of 63 GB/s)", H2D: 0.8 * 63 * gb, D2H: 0.8 * 63 * gb, Latency: 10e-6},
	"pcie3-peak": {Name: "PCIe 3.0 x16 (theoretical 15.75 GB/s)", H2D: 15.75 * gb, D2H: 15.75 * gb, Latency: 10e-6},
	"pcie4-peak": {Name: "PCIe 4.0 x16 (theoretical 31.5 GB/s)", H2D: 31.5 * gb, D2H: 31.5 * gb, Latency: 10e-6},
	"pcie5-peak": {Name: "PCIe 5.0 x16 (theoretical 63 GB/s)", H2D: 63 * gb, D2H: 63 * gb, Latency: 10e-6},

	// x8 (the RTX 4060 Ti's link): half the lanes, half the bytes.
	"pcie4-x8":      {Name: "PCIe 4.0 x8 (80% of 15.75 GB/s)", H2D: 0.8 * 15.75 * gb, D2H: 0.8 * 15.75 * gb, Latency: 10e-6},
	"pcie4-x8-peak": {Name: "PCIe 4.0 x8 (theoretical 15.75 GB/s)", H2D: 15.75 * gb, D2H: 15.75 * gb, Latency: 10e-6},
}

// Hosts are the host presets, by name. Bandwidths are channels x 8 bytes
// x the transfer rate (JEDEC DDR4/DDR5); CoreBW, the bytes/s one core
// streams, is an assumption (about 12 GB/s on current x86 cores); host
// Adam is taken to reach 70% of the memory bandwidth.
var Hosts = map[string]Host{
	// A laptop of the A1000's class: Intel Core i7-12800H (6 P + 8 E
	// cores, ark.intel.com), 2 channels of DDR5-4800 = 76.8 GB/s, 32 GB.
	"laptop": {Name: "laptop: 14 cores, 2 x DDR5-4800, 32 GB", Cores: 14, MemBW: 76.8 * gb, Memory: 32 * gib,
		CoreBW: 12 * gb, AdamBWFraction: 0.7, AdamOverhead: 20e-6},
	// A desktop of the RTX 4090's class: AMD Ryzen 9 7950X (16 cores,
	// amd.com), 2 channels of DDR5-5200 = 83.2 GB/s, 64 GB.
	"desktop": {Name: "desktop: 16 cores, 2 x DDR5-5200, 64 GB", Cores: 16, MemBW: 83.2 * gb, Memory: 64 * gib,
		CoreBW: 12 * gb, AdamBWFraction: 0.7, AdamOverhead: 20e-6},
	// A server of the A100/H100's class: AMD EPYC 9354 (32 cores, 12
	// channels of DDR5-4800 = 460.8 GB/s, amd.com), 512 GB.
	"server": {Name: "server: 32 cores, 12 x DDR5-4800, 512 GB", Cores: 32, MemBW: 460.8 * gb, Memory: 512 * gib,
		CoreBW: 12 * gb, AdamBWFraction: 0.7, AdamOverhead: 20e-6},
}

// defaults pairs each GPU with the link and host it usually comes with.
var defaults = map[string][2]string{
	"rtx4090":        {"pcie4", "desktop"},
	"rtx4060ti-16gb": {"pcie4-x8", "desktop"},
	"a1000-laptop":   {"pcie4", "laptop"},
	"a100-40gb":      {"pcie4", "server"},
	"a100-80gb":      {"pcie4", "server"},
	"h100":           {"pcie5", "server"},
	"h200":           {"pcie5", "server"},
	"rtx3090":        {"pcie4", "desktop"},
	"rtx3060":        {"pcie4", "desktop"},
	"rtx4060":        {"pcie4-x8", "desktop"},
	"rtx4080":        {"pcie4", "desktop"},
	"l4":             {"pcie4", "server"},
	"a10":            {"pcie4", "server"},
}

// Preset is the machine of a GPU preset with its usual link and host
// (link or host "" for those).
func Preset(gpu, link, host string) (Machine, error) {
	name, several := GPUName(gpu)
	switch {
	case len(several) > 0:
		return Machine{}, fmt.Errorf("--gpu: %q could be any of %s: say which", gpu, strings.Join(several, ", "))
	case name == "":
		return Machine{}, fmt.Errorf("--gpu: unknown GPU %q (want one of %s)", gpu, names(GPUs))
	}
	gpu = name
	g := GPUs[gpu]
	g.Eff, g.Launch, g.Context = gpuEff(), gpuLaunch, cudaContext
	d := defaults[gpu]
	if link == "" {
		link = d[0]
	}
	if host == "" {
		host = d[1]
	}
	l, ok := Links[link]
	if !ok {
		return Machine{}, fmt.Errorf("--link: unknown link %q (want one of %s)", link, names(Links))
	}
	h, ok := Hosts[host]
	if !ok {
		return Machine{}, fmt.Errorf("--host: unknown host %q (want one of %s)", host, names(Hosts))
	}
	return Machine{GPU: g, Link: l, Host: h}, nil
}

func names[V any](m map[string]V) string {
	var ns []string
	for n := range m {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return strings.Join(ns, ", ")
}
