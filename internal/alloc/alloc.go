// Package alloc measures how many heap bytes a piece of code allocates, so
// that the fuzz tests of the file parsers can hold them to a bound derived
// from the size of the file they read.
package alloc

import "runtime"

// Bytes returns the heap bytes fn allocates (the growth of TotalAlloc, so
// garbage collected during fn still counts).
func Bytes(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
