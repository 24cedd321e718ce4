// Which backends this binary has, for --device's help and -h: that
// depends on how it was built (make: cpu, and cuda where CUDA is
// installed; make sim: cuda on the simulated runtime), so the text comes
// from device.Built() and, for cuda, from the build tag (backends_*.go).

package main

import (
	"slices"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/device"
)

// hasCUDA says whether this binary can open --device cuda.
func hasCUDA() bool { return slices.Contains(device.Built(), device.CUDA) }

// builtBackends is "cpu" or "cpu, cuda": device.Built() as a list.
func builtBackends() string {
	var names []string
	for _, k := range device.Built() {
		names = append(names, string(k))
	}
	return strings.Join(names, ", ")
}

// deviceUsage is --device's help.
func deviceUsage() string {
	s := "`BACKEND` to train on: cpu, or cuda (device 0) or cuda:N; this binary has " + builtBackends()
	if hasCUDA() {
		return s + " (cuda " + cudaRuntime + ")"
	}
	return s + " (" + noCUDA + ")"
}

// backendsLine is -h's line on the backends of this binary.
func backendsLine() string {
	if hasCUDA() {
		return "Backends in this binary: " + builtBackends() + " (cuda " + cudaRuntime + ")."
	}
	return "Backends in this binary: " + builtBackends() + " (" + noCUDA + ")."
}

// noCUDA says how to get cuda, in a binary without it.
const noCUDA = "no cuda: `make` builds it where nvcc and CUDA's libraries are installed"
