//go:build race

package hf

// raceEnabled: the race detector is on; TestLoadMemory measures resident
// memory, which the detector's shadow memory would multiply.
const raceEnabled = true
