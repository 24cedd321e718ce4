// The run's memory: the plan of a run's device and host memory (the
// engine's, plus the run's own host allocations), its check against
// --device-mem and --host-mem (or the machine's available memory) before
// anything large is allocated, and the bound on the Go heap's garbage
// that keeps the host within the plan once the run is going.
//
// Limits: the plan counts allocations by their size formulas, not by
// measuring them (memory_test.go's TestHostPlanMeasured compares the two);
// the machine's available memory is known on Linux only.

package train

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/quant"
)

// Memory is the predicted memory and link traffic of a run.
type Memory = engine.Memory

// MemoryOf predicts the device and host memory of training cfg with the
// model mc, in cfg's mode, before any data is read: the plan of a run
// adds the tokenized data's bytes (run.checkMemory). --grad-residency
// auto is resolved as the run resolves it, against --device-mem.
func MemoryOf(mc model.Spec, c Config) (Memory, error) {
	return MemoryOfRanks(mc, c, 1)
}

// MemoryOfRanks is MemoryOf for one rank of ranks that train
// together (mpirun -np ranks): what each rank's process holds.
func MemoryOfRanks(mc model.Spec, c Config, ranks int) (Memory, error) {
	_, src, err := catalog.Resolve(c.Model)
	fromCheckpoint := err == nil && src != ""
	if c, err = resolveGradResidency(mc, c, src, fromCheckpoint, ranks, c.DeviceMem); err != nil {
		return Memory{}, err
	}
	return memoryOf(mc, c, src, fromCheckpoint, nil, ranks)
}

// ResolveGradResidency returns c with --grad-residency auto resolved for
// one rank of ranks on a device of budget bytes (0: unlimited): zero
// mode keeps the whole gradient on the device when the plan with it
// fits, and a ring of per-group slots otherwise (engine/ring.go: less
// device memory for the gradients going down once per micro-batch, and
// a host sum that zero's host Adam, the bottleneck with several
// micro-batches, pays for). lsp always takes the ring (S and the
// projectors of the blocks in flight, lsp.InFlight): the same bits, and
// its traffic, d x d per matrix down and sparse projectors up per
// micro-batch, hides behind the backward (plan: within 2% of the step).
// Several ranks, and native, keep it whole.
func ResolveGradResidency(mc model.Spec, c Config, ranks int, budget int64) (Config, error) {
	_, src, err := catalog.Resolve(c.Model)
	return resolveGradResidency(mc, c, src, err == nil && src != "", ranks, budget)
}

func resolveGradResidency(mc model.Spec, c Config, src string, fromCheckpoint bool, ranks int, budget int64) (Config, error) {
	if c.GradResidency != engine.ResidencyAuto && c.GradResidency != "" {
		return c, nil
	}
	c.GradResidency = engine.ResidencyWhole
	if c.Mode == engine.LSP && ranks == 1 {
		c.GradResidency = engine.ResidencyRing
	}
	if c.Mode != engine.Zero || ranks > 1 || budget <= 0 {
		return c, nil
	}
	whole, err := memoryOf(mc, c, src, fromCheckpoint, nil, ranks)
	if err != nil {
		return c, err
	}
	if whole.DeviceTotal() > budget {
		c.GradResidency = engine.ResidencyRing
	}
	return c, nil
}

// goHeapHeadroom is the Go heap garbage a run lets build up between
// collections once set up (boundGarbage), with the compute kernels'
// pooled scratch: a host part of every plan.
const goHeapHeadroom = 64 << 20

// memoryOf is MemoryOf with the kind of --model known (src, the
// checkpoint's path; fromCheckpoint picks the default of --dense-params)
// and the data ds when loaded (nil: not counted). To the engine's plan it
// adds the run's own host memory, by the size formulas of the
// allocations: the device's when the backend keeps it in host memory,
// the staging buffer, the data, the heap's headroom, and the transients
// of the initial weights, a resume and the export (engine.Memory says how
// the transients add up). ranks > 1 plans one rank of a data-parallel
// run.
func memoryOf(mc model.Spec, c Config, src string, fromCheckpoint bool, ds *data.Dataset, ranks int) (Memory, error) {
	ec := c.engineConfig(fromCheckpoint)
	if ranks > 1 {
		ec.Comm = comm.Planned{Ranks: ranks}
		if c.Collectives != CollectivesHost && c.Device.Base() == device.CUDA {
			ec.DeviceComm = engine.PlannedDevice{Ranks: ranks}
		}
	}
	p, err := engine.MemoryOf(mc, c.Batch, c.SeqLen, c.GradAccum, c.DType, ec)
	if err != nil {
		return p, err
	}
	p.DeviceOnHost = c.Device.Base() == device.CPU
	p.Host = append(p.Host, engine.Part{Name: "transfer staging", Bytes: backend.StagingBytes},
		engine.Part{Name: "Go heap headroom and kernel scratch", Bytes: goHeapHeadroom})
	if ds != nil {
		p.Host = append(p.Host, engine.Part{Name: "data", Bytes: datasetBytes(ds)})
	}
	if b := generationBytes(mc, c, ds); b > 0 {
		p.Device = append(p.Device, engine.Part{Name: "generation cache", Bytes: b})
	}
	N := int64(mc.NumParams())
	// lora's adapters come to the host whole: read from --adapter (held
	// until the engine's Init, over the weights' load) and downloaded for
	// each export, merged as the weights stream by.
	var adapters, baseLoad int64
	if c.Mode == engine.LoRA {
		idx, err := model.NewIndex(mc)
		if err != nil {
			return p, err
		}
		if f := ec.LoRA.Base; f != 0 {
			// A quantized base holds one block matrix as it loads
			// (quant.Base.Store); a resume loads it again, then compares
			// each chunk of the checkpoint's with the device's.
			baseLoad = quant.LoadBytes(idx, f)
		}
		lc := ec.LoRA.WithDefaultTargets(mc)
		sites, err := lora.Sites(idx, lc)
		if err != nil {
			return p, err
		}
		adapters = 4 * int64(lora.Elems(sites, lc.R))
	}
	var adapterRead int64
	if c.Adapter != "" {
		adapterRead = adapters
	}
	// A checkpoint write and a restore stream every tensor a chunk at a
	// time (train/checkpoint, the engine's StateArrays and
	// LoadStateFrom).
	p.Transient = append(p.Transient, engine.Part{Name: "checkpoint write", Bytes: checkpoint.SaveBytes(int(N)) + p.StateWrite})
	switch {
	case c.Resume:
		restore := checkpoint.RestoreBytes(int(N)) + p.StateRead
		if baseLoad > 0 {
			restore += checkpoint.RestoreBytes(int(N)) // Verify's copy of a chunk, fetched from the device
			p.Transient = append(p.Transient, engine.Part{Name: loadName(fromCheckpoint), Bytes: loadBytes(mc, src, fromCheckpoint) + baseLoad})
		}
		p.Transient = append(p.Transient, engine.Part{Name: "checkpoint restore", Bytes: restore})
	default:
		p.Transient = append(p.Transient, engine.Part{Name: loadName(fromCheckpoint), Bytes: loadBytes(mc, src, fromCheckpoint) + adapterRead + baseLoad})
	}
	// The export streams from the device (run.export): the writer's
	// buffers (and lora's adapters).
	p.Transient = append(p.Transient, engine.Part{Name: "export", Bytes: catalog.ExportBytes(mc) + adapters})
	return p, nil
}

// loadName is the phase setInitialWeights runs in.
func loadName(fromCheckpoint bool) string {
	if fromCheckpoint {
		return "weights load"
	}
	return "initial weights"
}

// loadBytes is what setInitialWeights holds on the host: a checkpoint
// load's buffers, or a preset's initialisation's (mc.InitEach's buffer).
func loadBytes(mc model.Spec, src string, fromCheckpoint bool) int64 {
	if fromCheckpoint {
		return catalog.LoadBytes(mc, src)
	}
	return model.InitBytes(mc)
}

// generationBytes is the device memory exact match's KV-cache decoder
// takes (eval.ExactMatch, between steps, on top of the training's
// buffers): an fp32 model generates with it, a bf16 one without. It is 0
// when nothing is generated: --eval-generate 0, no held-out records
// (plain text; ds nil: by the --data or --eval-data path), or a family
// without a cache.
func generationBytes(mc model.Spec, c Config, ds *data.Dataset) int64 {
	dec, ok := mc.(model.DecoderSpec)
	records := c.EvalFraction > 0 && data.HasRecords(c.Data) || c.EvalData != "" && data.HasRecords(c.EvalData)
	if ds != nil {
		records = len(ds.EvalRecords) > 0
	}
	if !ok || c.EvalGenerate == 0 || c.DType != backend.F32 || !records {
		return 0
	}
	return dec.DecoderBytes(c.SeqLen, c.DType)
}

// datasetBytes is the host memory of the loaded data: every example's
// tokens, target spans (conversations) and header, and the eval records'
// text and prompt tokens (conversations: they share the eval examples'
// memory, counted again to stay on the safe side).
func datasetBytes(ds *data.Dataset) int64 {
	const exampleHeader = int64(unsafe.Sizeof(data.Example{}))
	const span = int64(unsafe.Sizeof(data.Span{}))
	var b int64
	for _, set := range [][]data.Example{ds.Train, ds.Eval} {
		for _, ex := range set {
			b += exampleHeader + 4*int64(len(ex.Tokens)) + span*int64(len(ex.Spans))
		}
	}
	for _, r := range ds.EvalRecords {
		b += int64(unsafe.Sizeof(r)) + int64(len(r.Prompt)+len(r.Response))
	}
	for _, p := range ds.EvalPrompts {
		b += int64(unsafe.Sizeof(p)) + 4*int64(len(p))
	}
	// The loader's order over the training examples.
	return b + 8*int64(len(ds.Train))
}

// checkMemory plans the run's memory and refuses a plan above
// --device-mem, or above --host-mem (by default the machine's available
// memory), before anything is allocated.
func (r *run) checkMemory() error {
	cfg, err := resolveGradResidency(r.mc, r.cfg, r.src, r.fromCheckpoint, r.world.size(), r.cfg.DeviceMem)
	if err != nil {
		return err
	}
	r.cfg = cfg // the engine is built with the residency resolved
	plan, err := memoryOf(r.mc, cfg, r.src, r.fromCheckpoint, r.ds, r.world.size())
	if err != nil {
		return err
	}
	r.memory = plan
	r.log.Info("memory plan", "mode", cfg.Mode, "grad_residency", cfg.GradResidency, "device_bytes", plan.DeviceTotal(), "host_peak_bytes", plan.HostPeak(),
		"link_bytes_per_step", plan.LinkD2H+plan.LinkH2D, "detail", plan.String())
	if cfg.DeviceMem > 0 && plan.DeviceTotal() > cfg.DeviceMem {
		hint := "lower --batch or --seq-len, use --mode lsp (or zero), or a smaller model"
		if cfg.Mode == engine.LSP {
			hint = "lower --batch, --seq-len or --d, or use a smaller model"
		}
		if h, err := r.recomputeHint(); err != nil {
			return err
		} else if h != "" {
			hint = h + "; or " + hint
		}
		return flagErr("device-mem", "the run needs %d bytes of device memory (%s) but the budget is %d bytes; %s",
			plan.DeviceTotal(), deviceParts(plan), cfg.DeviceMem, hint)
	}
	return checkHostMemory(plan, cfg.HostMem)
}

// recomputeHint names the least --recompute setting above the run's
// whose plan fits --device-mem, or says what the most recomputation
// would need when none does ("" when the run already recomputes all it
// can).
func (r *run) recomputeHint() (string, error) {
	cfg := r.cfg
	var need int64
	for _, rc := range model.Recomputes[cfg.Recompute+1:] {
		cfg.Recompute = rc
		p, err := memoryOf(r.mc, cfg, r.src, r.fromCheckpoint, r.ds, r.world.size())
		if err != nil {
			return "", err
		}
		if need = p.DeviceTotal(); need <= cfg.DeviceMem {
			return fmt.Sprintf("--recompute %v fits (%d bytes: activations recomputed in the backward, the same results)", rc, need), nil
		}
	}
	if need == 0 {
		return "", nil
	}
	return fmt.Sprintf("even --recompute layer needs %d bytes", need), nil
}

// deviceParts writes the device side of a plan in MiB, part by part (the
// host side is not device memory and not checked against --device-mem).
func deviceParts(p Memory) string {
	parts := make([]string, len(p.Device))
	for i, x := range p.Device {
		parts[i] = fmt.Sprintf("%s %.2f", x.Name, float64(x.Bytes)/(1<<20))
	}
	return fmt.Sprintf("%.2f MiB: %s", float64(p.DeviceTotal())/(1<<20), strings.Join(parts, ", "))
}

// meminfoPath is where memAvailable reads; a variable for tests.
var meminfoPath = "/proc/meminfo"

// memAvailable is the kernel's estimate of the memory a new allocation
// can have without swapping (MemAvailable of /proc/meminfo, in bytes),
// and false where it is unknown (not Linux, or a kernel before 3.14).
func memAvailable() (int64, bool) { return procKiB(meminfoPath, "MemAvailable:") }

// procKiB reads the field key ("MemAvailable:") of a /proc file of
// "key value kB" lines, in bytes; false when the file or the field cannot
// be read.
func procKiB(path, key string) (int64, bool) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), key)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 {
			return 0, false
		}
		return kb << 10, true
	}
	return 0, false
}

// checkHostMemory refuses a plan whose host peak is above --host-mem, or
// without it above the memory the machine has available, before anything
// large is allocated. Where neither is known nothing is checked.
func checkHostMemory(p Memory, hostMem int64) error {
	budget, what := hostMem, "the budget (--host-mem)"
	if budget == 0 {
		avail, ok := memAvailable()
		if !ok {
			return nil
		}
		budget, what = avail, "the memory this machine has available (MemAvailable in "+meminfoPath+"; --host-mem sets another budget)"
	}
	if need := p.HostPeak(); need > budget {
		return flagErr("host-mem", "the run needs %d bytes of host memory (%s) but %s is %d bytes; "+
			"lower --batch or --seq-len, use a smaller model, or on the cpu device (whose device memory is host memory) "+
			"use --mode lsp", need, p.HostString(), what, budget)
	}
	return nil
}

// limitGarbage bounds the Go heap's garbage (boundGarbage) once the
// engine's memory is allocated, before the initial weights or a
// checkpoint are loaded, whose values are garbage as soon as they are
// uploaded.
func (r *run) limitGarbage() error {
	r.restoreGC = boundGarbage()
	return nil
}

// boundGarbage lowers the Go collector's target, once a run's engine is
// allocated, so that the garbage between collections is at most goHeapHeadroom
// rather than as much as the live heap (GOGC=100), which on the CPU
// backend holds the device memory: the steps' garbage would otherwise
// grow for hundreds of steps to gigabytes. The returned func restores
// the setting. A GOGC in the environment is left as the user set it.
func boundGarbage() (restore func()) {
	if _, set := os.LookupEnv("GOGC"); set {
		return func() {}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	pct := 100
	if live := int64(ms.HeapAlloc); live > 0 {
		pct = int(max(1, min(100, 100*goHeapHeadroom/live)))
	}
	old := debug.SetGCPercent(pct)
	return func() { debug.SetGCPercent(old) }
}

// phaseHook, when a test sets it, is called as each transient phase of
// the host plan begins (begin true) and ends, with the name of its
// Transient part, so that the test can measure each phase's resident
// memory against the plan's (memory_test.go).
var phaseHook func(name string, begin bool)

// phase tells phaseHook that the transient phase name begins, and
// returns the call that says it ended.
func phase(name string) (end func()) {
	if phaseHook == nil {
		return func() {}
	}
	phaseHook(name, true)
	return func() { phaseHook(name, false) }
}

// releaseHost collects the garbage of a phase that allocated a large
// transient on the Go heap (the initial weights, a loaded or saved
// checkpoint, the export) and returns its pages to the OS. Without it
// that garbage stays resident until the heap doubles its live size,
// which on the CPU backend (device memory is Go heap) is gigabytes, and
// the next phase's transient would come on top of it. The host plan
// (HostPeak) counts one phase's transient at a time, which this makes
// true.
func releaseHost() { debug.FreeOSMemory() }
