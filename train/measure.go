// What a run measures of its own steps: the engine's step time and link
// traffic, the projector checks' time, and the device's high-water mark
// (Measurements, which a comparison of runs reads), one step's times
// (StepTimes, for lsp-train profile), and the peak device and host memory
// beside the plan (MemoryUse, for the summary).
//
// Limits: only this process's steps are measured, not those before a
// resume; the engine's time leaves out the data, the checks, eval and
// checkpoints; the device peak is what the backend allocated (not the
// driver's or the kernels' own), the host peak is known on Linux only.

package train

// Measurements are what a run measured of its own steps in this process,
// beside the plan it was checked against: the figures a comparison of
// runs reads (Options.Measurements).
type Measurements struct {
	Memory           Memory  // the predicted memory and link traffic the run was checked against
	StepSeconds      float64 // mean wall time of an optimizer step (engine Step only: no checks, eval or checkpoints)
	CheckSeconds     float64 // total wall time of the projector checks (lsp)
	LinkBytesPerStep float64 // mean device-host bytes (both ways) copied during an optimizer step
	DevicePeak       int64   // the backend's device memory high-water mark at the end
}

// StepTimes are one optimizer step's wall times (Options.AfterStep).
type StepTimes struct {
	Step   int     // the step just taken
	Total  float64 // the whole step: data, projector check, engine step, skipped attempts
	Engine float64 // the engine's Step (the last attempt's)
	Check  float64 // the projector check before it (0: none was due)
	Tokens int64   // tokens of the step
}

// stepMeter measures this process's optimizer steps as they go: the
// sums behind Measurements and CommBytesPerStep, and the latest step's
// figures that StepTimes and the step's metrics record report.
type stepMeter struct {
	stepSecs, checkSecs float64 // engine steps' and projector checks' wall time
	stepLink            int64   // device-host bytes copied during the engine steps
	stepsTimed          int
	commBytes           int64 // payload this rank sent during its steps
	// The latest step's engine and check times (StepTimes) and payload.
	lastEngine, lastCheck float64
	lastComm              int64
}

// newStep forgets the previous step's check, as a step need not have one.
func (m *stepMeter) newStep() { m.lastCheck = 0 }

// check counts a projector check of secs seconds.
func (m *stepMeter) check(secs float64) {
	m.lastCheck = secs
	m.checkSecs += secs
}

// engineStep counts the engine's step: secs seconds, link bytes copied
// between device and host.
func (m *stepMeter) engineStep(secs float64, link int64) {
	m.lastEngine = secs
	m.stepSecs += secs
	m.stepLink += link
	m.stepsTimed++
}

// sent counts the payload this rank sent to the others during a step.
func (m *stepMeter) sent(bytes int64) {
	m.lastComm = bytes
	m.commBytes += bytes
}

// commPerStep is the mean payload sent per step (0 before any step).
func (m *stepMeter) commPerStep() float64 {
	if m.stepsTimed == 0 {
		return 0
	}
	return float64(m.commBytes) / float64(m.stepsTimed)
}

// measurements are the run's Measurements so far.
func (r *run) measurements() Measurements {
	m := Measurements{Memory: r.memory, CheckSeconds: r.meter.checkSecs}
	if r.be != nil {
		m.DevicePeak = r.be.MemStats().HighWater
	}
	if n := r.meter.stepsTimed; n > 0 {
		m.StepSeconds = r.meter.stepSecs / float64(n)
		m.LinkBytesPerStep = float64(r.meter.stepLink) / float64(n)
	}
	return m
}

// MemoryUse is a process's measured peak memory beside its plan (the
// summary's memory line): the device's as its backend counts it, the
// host's as the kernel does.
type MemoryUse struct {
	// DevicePeak is the backend's high-water mark of the device memory
	// allocated through it (MemStats.HighWater), DevicePlanned the
	// plan's device total, DeviceBudget the backend's budget (0:
	// unlimited; --device-mem).
	DevicePeak, DevicePlanned, DeviceBudget int64
	// HostPeak is the process's resident peak (VmHWM of
	// /proc/self/status: everything the process held at once, the Go
	// runtime and the binary included), 0 where it is unknown (not
	// Linux); HostPlanned is the plan's host peak (Memory.HostPeak),
	// which counts what the run allocates over the process's own at
	// start-up.
	HostPeak, HostPlanned int64
	// DeviceOnHost says the device memory is host memory (the cpu
	// backend): HostPeak and HostPlanned include it.
	DeviceOnHost bool
}

// memoryUse measures the run's peak memory so far beside its plan.
func (r *run) memoryUse() MemoryUse {
	m := MemoryUse{DevicePlanned: r.memory.DeviceTotal(), HostPlanned: r.memory.HostPeak(), DeviceOnHost: r.memory.DeviceOnHost}
	if r.be != nil {
		ms := r.be.MemStats()
		m.DevicePeak, m.DeviceBudget = ms.HighWater, ms.Budget
	}
	m.HostPeak, _ = residentPeak()
	return m
}

// statusPath is where residentPeak reads; a variable for tests.
var statusPath = "/proc/self/status"

// residentPeak is the most resident memory this process has held since it
// started (VmHWM of /proc/self/status, in bytes), and false where that is
// unknown (not Linux).
func residentPeak() (int64, bool) { return procKiB(statusPath, "VmHWM:") }
