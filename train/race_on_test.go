//go:build race

package train

// raceEnabled: the race detector is on; TestHostPlanMeasured measures
// resident memory, which the detector's shadow memory would multiply.
const raceEnabled = true
