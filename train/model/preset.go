package model

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// PresetNames lists a family's preset names, sorted.
func PresetNames[C any](presets map[string]C) []string {
	return slices.Sorted(maps.Keys(presets))
}

// Preset returns a family's preset name, or an error that lists the
// known ones; what says what name is ("llama preset").
func Preset[C any](presets map[string]C, what, name string) (C, error) {
	c, ok := presets[name]
	if !ok {
		return c, fmt.Errorf("unknown %s %q (known: %s)", what, name, strings.Join(PresetNames(presets), ", "))
	}
	return c, nil
}
