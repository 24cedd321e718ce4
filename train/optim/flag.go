// ClipMode as a flag value (flag.Value), so --clip-mode is parsed once,
// where it is given.

package optim

import "github.com/lsp-offload/lsp-offload/train/flagerr"

// String is the clip mode's flag spelling.
func (c ClipMode) String() string { return string(c) }

// Set parses a --clip-mode value (flag.Value).
func (c *ClipMode) Set(s string) error { return flagerr.Set(c, ParseClipMode, s) }
