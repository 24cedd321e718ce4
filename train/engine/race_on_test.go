//go:build race

package engine

// raceEnabled: the race detector is on. Tests that race on purpose (an
// edge removed from the schedule) skip themselves; the race detector would
// report the very race they provoke.
const raceEnabled = true
