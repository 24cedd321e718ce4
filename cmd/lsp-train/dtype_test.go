package main

import (
	"flag"
	"testing"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// TestDefaultDType: without --dtype the storage type follows --device
// (bf16 on cuda, fp32 on cpu), whether the device comes from the command
// line or the config file; a --dtype given either way is kept.
func TestDefaultDType(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		file string // config file contents, "" for none
		want backend.DType
	}{
		{"cpu default", nil, "", backend.F32},
		{"cuda default", []string{"--device", "cuda"}, "", backend.BF16},
		{"cuda from the file", nil, `{"device": "cuda"}`, backend.BF16},
		{"cuda with --dtype fp32", []string{"--device", "cuda", "--dtype", "fp32"}, "", backend.F32},
		{"cuda with dtype in the file", []string{"--device", "cuda"}, `{"dtype": "fp32"}`, backend.F32},
		{"cpu with --dtype bf16", []string{"--dtype", "bf16"}, "", backend.BF16},
	} {
		cfg := train.Defaults()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		bindTrainFlags(fs, &cfg)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if tc.file != "" {
			if err := applyConfigFile(fs, writeJSON(t, tc.file)); err != nil {
				t.Fatal(err)
			}
		}
		defaultDType(fs, &cfg)
		if cfg.DType != tc.want {
			t.Errorf("%s: --dtype resolved to %v, want %v", tc.name, cfg.DType, tc.want)
		}
	}
}
