//go:build !openblas

// noblas.go: without -tags openblas there is nothing to compare with; the
// benchmark then reports this project's Sgemm alone.

package main

func newReference(int, bool) (reference, error) { return nil, nil }
