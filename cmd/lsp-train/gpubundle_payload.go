//go:build gpubundle

package main

import (
	"embed"
	"strings"
)

// payloadFS holds the gzip'd test binaries make gpu-bundle builds into
// cmd/lsp-train/bundle/ (not in git): only a -tags gpubundle build needs
// them, so every other build works from a plain checkout.
//
//go:embed bundle/*.test.gz
var payloadFS embed.FS

func init() {
	entries, err := payloadFS.ReadDir("bundle")
	if err != nil {
		return // embed checked the pattern at build time
	}
	for _, e := range entries {
		b, err := payloadFS.ReadFile("bundle/" + e.Name())
		if err == nil {
			testPayloads[strings.TrimSuffix(e.Name(), ".test.gz")] = b
		}
	}
}
