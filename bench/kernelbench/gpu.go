//go:build cuda && !cudasim

package kernelbench

const simulated = false
