//go:build !race

package hf

const raceEnabled = false
