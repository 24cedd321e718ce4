// Mode and DenseParams as flag values (flag.Value), so the command parses
// --mode and --dense-params once, where they are given, and the rest of the
// program holds typed values.

package engine

import "github.com/lsp-offload/lsp-offload/train/flagerr"

// String is the mode's flag spelling.
func (m Mode) String() string { return string(m) }

// Set parses a --mode value (flag.Value).
func (m *Mode) Set(s string) error { return flagerr.Set(m, ParseMode, s) }

// String is the flag spelling; "" is the unset default (frozen from a
// checkpoint, device for a preset).
func (d DenseParams) String() string { return string(d) }

// Set parses a --dense-params value (flag.Value).
func (d *DenseParams) Set(s string) error { return flagerr.Set(d, ParseDenseParams, s) }

// String is the flag spelling of a gradient residency.
func (r GradResidency) String() string { return string(r) }

// Set parses a --grad-residency value (flag.Value).
func (r *GradResidency) Set(s string) error { return flagerr.Set(r, ParseGradResidency, s) }
