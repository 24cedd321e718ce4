// What a run measures of its own steps: the engine's step time and link
// traffic, the projector checks' time, and the device's high-water mark
// (Measurements, which a comparison of runs reads), and one step's times
// (StepTimes, for lsp-train profile).
//
// Limits: only this process's steps are measured, not those before a
// resume; the engine's time leaves out the data, the checks, eval and
// checkpoints.

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
