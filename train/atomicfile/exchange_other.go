//go:build !linux

// No atomic exchange outside Linux: WriteDir moves the old directory aside.

package atomicfile

import "errors"

func exchange(a, b string) error { return errors.ErrUnsupported }
