//go:build cuda && !cudasim

package pciebench

const simulated = false
