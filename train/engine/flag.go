// Mode and DenseParams as flag values (flag.Value), so the command parses
// --mode and --dense-params once, where they are given, and the rest of the
// program holds typed values.

package engine

// String is the mode's flag spelling.
func (m Mode) String() string { return string(m) }

// Set parses a --mode value (flag.Value).
func (m *Mode) Set(s string) error {
	v, err := ParseMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// String is the flag spelling; "" is the unset default (frozen from a
// checkpoint, device for a preset).
func (d DenseParams) String() string { return string(d) }

// String is the flag spelling of each refit setting.
func (r Refit) String() string  { return string(r) }
func (a Accept) String() string { return string(a) }
func (w Rewarm) String() string { return string(w) }

// Set parses a --refit value (flag.Value).
func (r *Refit) Set(s string) error { return set(r, ParseRefit, s) }

// Set parses an --accept value (flag.Value).
func (a *Accept) Set(s string) error { return set(a, ParseAccept, s) }

// Set parses a --rewarm value (flag.Value).
func (w *Rewarm) Set(s string) error { return set(w, ParseRewarm, s) }

func set[T any](dst *T, parse func(string) (T, error), s string) error {
	v, err := parse(s)
	if err != nil {
		return err
	}
	*dst = v
	return nil
}

// Set parses a --dense-params value (flag.Value).
func (d *DenseParams) Set(s string) error {
	v, err := ParseDenseParams(s)
	if err != nil {
		return err
	}
	*d = v
	return nil
}
