package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/eval"
)

// The -h of --model lists every family's presets and the model types a
// directory may hold, from train/catalog, so that a family added there is
// documented here without an edit.
func TestModelFlagListsFamilies(t *testing.T) {
	fs := flag.NewFlagSet("lsp-train", flag.ContinueOnError)
	bindTrainFlags(fs, new(train.Config))
	usage := fs.Lookup("model").Usage
	for _, want := range append(catalog.Presets(), catalog.ModelTypes()...) {
		if !strings.Contains(usage, want) {
			t.Errorf("--model's usage %q does not name %q", usage, want)
		}
	}
	sfs := flag.NewFlagSet("lsp-train sample", flag.ContinueOnError)
	bindSampleFlags(sfs, new(eval.SampleOptions), new(bool))
	for _, want := range catalog.ModelTypes() {
		if u := sfs.Lookup("model").Usage; !strings.Contains(u, want) {
			t.Errorf("sample --model's usage %q does not name model_type %q", u, want)
		}
	}
}
