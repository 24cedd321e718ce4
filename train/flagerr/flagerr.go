// Package flagerr is the error of a bad command-line flag value, shared by
// every package that checks what a user gave (the run, sampling and the
// compare job), so each names its flag the same way: "--flag: what is
// wrong"; and Set, the parse-and-store step of every typed flag.Value.
package flagerr

import "fmt"

// Error is a bad flag value; Flag names it (without the dashes).
type Error struct {
	Flag string
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("--%s: %s", e.Flag, e.Msg) }

// New returns an *Error for flag with a formatted message.
func New(flag, format string, a ...any) error {
	return &Error{Flag: flag, Msg: fmt.Sprintf(format, a...)}
}

// Set is the Set method of a flag.Value whose type T has a parser: it
// stores parse(s) in dst, or returns parse's error and leaves dst as it
// was.
func Set[T any](dst *T, parse func(string) (T, error), s string) error {
	v, err := parse(s)
	if err != nil {
		return err
	}
	*dst = v
	return nil
}
