//go:build race

package calibrate

// raceEnabled: the race detector is on, and the backend's Go loops run
// many times slower than the C triad, so bandwidths are not compared.
const raceEnabled = true
