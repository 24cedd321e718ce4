// DType as a flag value (flag.Value) and as JSON text, so --dtype and
// --grad-dtype are parsed once, where they are given, and configurations
// and checkpoints hold the same spellings as the flags ("fp32", "bf16").
//
// Limits: only the storage types a user may choose parse (ParseDType);
// I32 marshals as "i32" but does not parse back.

package backend

import "github.com/lsp-offload/lsp-offload/train/flagerr"

// Set parses a dtype flag value (flag.Value).
func (d *DType) Set(s string) error { return flagerr.Set(d, ParseDType, s) }

// MarshalText writes the flag spelling (encoding.TextMarshaler).
func (d DType) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText parses a flag spelling (encoding.TextUnmarshaler).
func (d *DType) UnmarshalText(b []byte) error { return d.Set(string(b)) }
