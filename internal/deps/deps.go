//go:build tools

// Package deps pins modules that the project uses while code that imports
// them is being written, so that `go mod tidy` keeps them.
package deps

import (
	_ "github.com/klauspost/cpuid/v2"
	_ "github.com/tiktoken-go/tokenizer"
	_ "golang.org/x/sys/unix"
	_ "golang.org/x/term"
	_ "gonum.org/v1/plot"
)
