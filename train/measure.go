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

// measurements are the run's Measurements so far.
func (r *run) measurements() Measurements {
	m := Measurements{Memory: r.memory, CheckSeconds: r.checkSecs}
	if r.be != nil {
		m.DevicePeak = r.be.MemStats().HighWater
	}
	if r.stepsTimed > 0 {
		m.StepSeconds = r.stepSecs / float64(r.stepsTimed)
		m.LinkBytesPerStep = float64(r.stepLink) / float64(r.stepsTimed)
	}
	return m
}
