package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/plan"
)

// TestAnswerFits: for every preset GPU and every preset model, the
// command line the answer suggests in
// each mode, planned again from its own flags through the run's memory
// plan, fits the backend's budget (the card less its context and
// headroom) and the host; a mode with no suggestion has none that fits at
// micro-batch 1 with --recompute layer either.
func TestAnswerFits(t *testing.T) {
	if testing.Short() {
		t.Skip("plans every preset model on every preset card")
	}
	var gpus []string
	for name := range plan.GPUs {
		gpus = append(gpus, name)
	}
	slices.Sort(gpus)
	for _, name := range catalog.Presets() {
		o := defaultPlanOptions()
		spec, _, err := catalog.Resolve(name)
		if err != nil {
			t.Fatal(err)
		}
		o.model, o.batch, o.seqLen, o.accum = name, 2, min(512, spec.MaxSeqLen()), 2
		for _, gpu := range gpus {
			o.gpu = gpu
			j, err := o.parse()
			if err != nil {
				t.Fatal(err)
			}
			m := j.machine
			for _, mode := range j.modes {
				a, err := o.answerMode(j, mode, m)
				if err != nil {
					t.Fatalf("%s on %s, %s: %v", name, gpu, mode, err)
				}
				if a.best == nil {
					oc := o
					oc.batch, oc.accum = 1, o.batch*o.accum
					tc := oc.trainConfig(j, mode)
					tc.Recompute = model.RecomputeLayer
					if tc, err = train.ResolveGradResidency(j.spec, tc, 1, m.GPU.Budget()); err != nil {
						t.Fatal(err)
					}
					mem, err := train.MemoryOf(j.spec, tc)
					if err != nil {
						t.Fatal(err)
					}
					if mem.DeviceTotal() <= m.GPU.Budget() && mem.HostPeak() <= m.Host.Memory {
						t.Errorf("%s on %s, %s: no suggestion, but micro-batch 1 with --recompute layer fits", name, gpu, mode)
					}
					continue
				}
				c := a.best
				tc := c.o.trainConfig(j, mode)
				tc.Recompute = c.rc
				tc, err = train.ResolveGradResidency(j.spec, tc, 1, m.GPU.Budget())
				if err != nil {
					t.Fatal(err)
				}
				mem, err := train.MemoryOf(j.spec, tc)
				if err != nil {
					t.Fatal(err)
				}
				if mem.DeviceTotal() > m.GPU.Budget() || mem.HostPeak() > m.Host.Memory {
					t.Errorf("%s on %s, %s: suggested %q needs %d bytes of device (budget %d) and %d of host (%d)",
						name, gpu, mode, c.command(mode), mem.DeviceTotal(), m.GPU.Budget(), mem.HostPeak(), m.Host.Memory)
				}
				if c.o.batch*c.o.accum != o.batch*o.accum || !strings.Contains(c.command(mode), fmt.Sprintf("--seq-len %d", o.seqLen)) {
					t.Errorf("%s on %s, %s: %q changes the global batch", name, gpu, mode, c.command(mode))
				}
			}
		}
	}
}

// TestPlanAnswer: the answer for llama-7b at 4 x 1024 on the RTX 4090 is
// lsp (and lora) with micro-batches of one and no recomputation, faster
// than the summary's lsp row (4 x 1024 with --recompute layer), lora the
// fastest (no link, no host Adam), says what native
// and zero lack (the device memory and the smallest card with it; the
// host memory); a checkpoint directory's --dense-params defaults to
// frozen, as training's does; on the 8 GB RTX 4060 nothing fits, and it
// says so.
func TestPlanAnswer(t *testing.T) {
	planOutput(t, []string{"--model", "llama-7b", "--gpu", "4090", "--batch", "4", "--seq-len", "1024"},
		"answer (the global batch kept: 4 x 1024 tokens per step; on NVIDIA GeForce RTX 4090 24 GB, 22.43 GiB usable):",
		"native: nothing fits: it needs at least 100.92 GiB of device memory (--batch 1 --recompute layer), the card has 22.43 GiB usable; the smallest preset card with enough is h200; use --mode lsp or lora",
		"zero: nothing fits: it needs at least 100.96 GiB of host memory, the host has 64.00 GiB; use --mode lsp or lora",
		"lsp: lsp-train --model llama-7b --mode lsp --batch 1 --grad-accum 4 --seq-len 1024 --recompute none --dtype bf16 --dense-params device --d 512",
		"(device 19.80 GiB, host 1.43 GiB, 3075 tokens/s)",
		"     lsp      layer   18.13 GiB    1.71 GiB          yes  1.700 s      2410",
		// lora: the frozen base, native's activations and no link.
		"lora: lsp-train --model llama-7b --mode lora --batch 1 --grad-accum 4 --seq-len 1024 --recompute none --dtype bf16 --dense-params device --lora-r 8",
		"(device 20.43 GiB, host 568.03 MiB, 3244 tokens/s)",
		"fastest that fits: lora")
	// A checkpoint directory's --dense-params is frozen, as training
	// resolves it (a preset's is device): the paper's 1.3B case in 4 GB.
	code, stdout, _ := runCmd(t, "plan", "--model", filepath.Join("..", "..", "train", "plan", "testdata", "deepseek-coder-1.3b-base"),
		"--gpu", "a1000-laptop", "--mode", "lsp", "--batch", "2", "--seq-len", "1024")
	if code != 0 || strings.Contains(stdout, "dense optimizer") ||
		!strings.Contains(stdout, "--mode lsp --batch 2 --grad-accum 1 --seq-len 1024 --recompute layer --dtype bf16 --dense-params frozen --d 512") {
		t.Errorf("deepseek-coder-1.3b from its directory: exit %d, want --dense-params frozen by default\n%s", code, stdout)
	}
	code, stdout, _ = runCmd(t, "plan", "--model", "llama-7b", "--gpu", "4060", "--batch", "1", "--seq-len", "1024")
	if code != 0 || !strings.Contains(stdout, "nothing fits in any mode") ||
		!strings.Contains(stdout, "lsp: nothing fits: it needs at least 13.13 GiB of device memory (--batch 1 --recompute layer --dense-params frozen --d 128)") ||
		!strings.Contains(stdout, "lora: nothing fits: it needs at least 13.36 GiB of device memory (--batch 1 --recompute layer --dense-params frozen)") {
		t.Errorf("llama-7b on the RTX 4060: exit %d\n%s", code, stdout)
	}
}

// TestPlanWhatFits: plan --gpu without --model lists, per mode, the
// largest preset model that fits at the stated global batch, with its
// command line (TestAnswerFits checks such lines fit): on the RTX 4090 at
// 1 x 1024, lsp llama3-8b (its 128k-token embedding's optimizer state
// frozen, which is said), zero gpt2-xl (a 7B model's fp32 optimizer state
// is over the desktop host's 64 GiB), native a 1.3B model.
func TestPlanWhatFits(t *testing.T) {
	stdout := planOutput(t, []string{"--gpu", "rtx-4090", "--batch", "1", "--seq-len", "1024"},
		"what fits on NVIDIA GeForce RTX 4090 24 GB (22.43 GiB usable; host 64.00 GiB), at 1 x 1024 tokens per step",
		"native: at most deepseek-coder-1.3b (1.35B parameters): lsp-train --model deepseek-coder-1.3b --mode native",
		"zero: at most gpt2-xl (1.56B parameters): lsp-train --model gpt2-xl --mode zero",
		"lsp: at most llama3-8b (8.03B parameters): lsp-train --model llama3-8b --mode lsp --batch 1 --grad-accum 1 --seq-len 1024 --recompute none --dtype bf16 --dense-params frozen --d 512",
		"--dense-params frozen, not device: a different run",
		"lora: at most llama3-8b (8.03B parameters): lsp-train --model llama3-8b --mode lora --batch 1 --grad-accum 1 --seq-len 1024 --recompute none --dtype bf16 --dense-params frozen --lora-r 8",
		"(the presets: ")
	if strings.Contains(stdout, "== lsp ==") {
		t.Errorf("without --model the whole plan of a default model was printed:\n%s", stdout)
	}
}
