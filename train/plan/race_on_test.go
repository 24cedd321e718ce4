//go:build race

package plan

// raceEnabled: the race detector is on, and it slows the backend's Go
// loops unevenly, so predicted and measured steps are not compared.
const raceEnabled = true
