// Tests of the plan subcommand: the paper's two machines (the A1000
// laptop and the RTX 4090), the timeline files, and bad flags refused by
// name before anything is traced.

package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/calibrate"
	"github.com/lsp-offload/lsp-offload/train/plan"
)

func TestPlanCommand(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"gpt2-xl on the laptop", []string{"--model", "gpt2-xl", "--gpu", "a1000-laptop", "--batch", "1", "--seq-len", "512"},
			[]string{"NVIDIA RTX A1000 Laptop 4 GB", "== native ==", "== zero ==", "== lsp ==", "does NOT fit", "tokens/s", "critical path", "overlap"}},
		// The paper's 1.3B shape on the 16 GB card, from the config alone.
		{"deepseek-coder-1.3b on the 4060 Ti", []string{"--model", filepath.Join("..", "..", "train", "plan", "testdata", "deepseek-coder-1.3b-base"),
			"--gpu", "rtx4060ti-16gb", "--mode", "lsp", "--dense-params", "frozen", "--batch", "2", "--seq-len", "1024"},
			[]string{"NVIDIA GeForce RTX 4060 Ti 16 GB", "PCIe 4.0 x8", "== lsp =="}},
		{"llama-7b on the 4090", []string{"--model", "llama-7b", "--gpu", "rtx4090", "--timeline", filepath.Join(dir, "tl.png")},
			[]string{"RTX 4090", "6.74B parameters", "host memory", "S/Delta and subspace moments", "timeline: " + filepath.Join(dir, "tl-lsp.png")}},
		// Dense projectors: P m x d and Q n x d, half the bytes of tiny's
		// sparse ones at r = 16 (2.00 MiB); svd's refresh on the device
		// and its FLOPs per check.
		{"gaussian projectors", []string{"--model", "tiny", "--seq-len", "16", "--mode", "lsp", "--projector", "gaussian"},
			[]string{"projectors                                           1.00 MiB"}},
		{"svd projectors", []string{"--model", "tiny", "--seq-len", "16", "--mode", "lsp", "--projector", "svd"},
			[]string{"projectors                                           1.00 MiB", "svd refresh    ", "calibration  ",
				"lsp: svd refresh of one check (every --check-every steps, 100 steps by default): 8.1e+08 FLOPs in 16 randomized SVDs",
				"--d 32 --projector svd"}},
		{"one mode, sequential, overrides", []string{"--model", "tiny", "--seq-len", "16", "--mode", "zero", "--schedule", "sequential",
			"--device-mem", "1MiB", "--host-mem", "1GiB", "--host-bw", "10GB", "--link", "pcie3", "--timeline", filepath.Join(dir, "one.png")},
			[]string{"== zero ==", "1.00 MiB", "PCIe 3.0", "10 GB/s", "sequential schedule", "timeline: " + filepath.Join(dir, "one.png")}},
		// 7B in 24 GB: lsp needs the most recomputation at 2 x 2048; auto
		// picks it, and --recompute none says it does not fit and why.
		{"llama-7b recompute auto", []string{"--model", "llama-7b", "--gpu", "rtx4090", "--mode", "lsp", "--batch", "2", "--seq-len", "2048"},
			[]string{"recompute (auto: layer): device memory none ", "needs --recompute layer to fit", "lsp      layer"}},
		// Two ranks over 10 Gb Ethernet: each mode's bytes on the network
		// per step and their time, in the summary (lsp: S of 48 matrices
		// at the default d, 192 = a quarter of gpt2's 768: 6.75 MiB).
		{"data parallel", []string{"--model", "gpt2", "--ranks", "2", "--net", "10gbe", "--dense-params", "frozen"},
			[]string{"data parallelism: 2 ranks", "10 Gb Ethernet", "network: 474.70 MiB sent", "network: 6.75 MiB sent", "net/step"}},
		// deepseek-coder 1.3B in 4 GB: zero's whole gradient does not
		// fit, its ring does, at the same planned step time.
		{"zero grad ring auto", []string{"--model", "../../train/plan/testdata/deepseek-coder-1.3b-base", "--gpu", "a1000-laptop", "--mode", "zero",
			"--batch", "2", "--seq-len", "1024", "--recompute", "layer"},
			[]string{"gradients (auto: ring): the ring keeps 2.26 GiB less on the device (3.26 GiB against whole's 5.53 GiB)", "3.26 GiB", "yes"}},
		{"zero grad whole", []string{"--model", "../../train/plan/testdata/deepseek-coder-1.3b-base", "--gpu", "a1000-laptop", "--mode", "zero",
			"--batch", "2", "--seq-len", "1024", "--recompute", "layer", "--grad-residency", "whole", "--grad-accum", "2"},
			[]string{"gradients (--grad-residency whole)", "5.02 GiB down per step instead of 2.51 GiB", "fp32 accumulator", "no (device)"}},
		// lora beside the others at 1 x 1024, the base frozen as when
		// fine-tuning a checkpoint: the bf16 base, native's activations
		// (the frozen matrices' inputs are kept), the adapters and their
		// AdamW; seven GEMMs per adapted matrix (32 layers x 7) in the
		// step, and the command line with lora's flags.
		{"llama-7b every mode with lora", []string{"--model", "llama-7b", "--gpu", "rtx4090", "--batch", "1", "--seq-len", "1024",
			"--dense-params", "frozen", "--timeline", filepath.Join(dir, "all.png")},
			[]string{"== native ==", "== zero ==", "== lsp ==", "== lora ==", "adapters, grads and scratch", "lora adapters: 1568 GEMMs (unfused)",
				"lora       none   17.01 GiB", "--mode lora --batch 1 --grad-accum 1 --seq-len 1024 --recompute none --dtype bf16 --dense-params frozen --lora-r 8",
				"timeline: " + filepath.Join(dir, "all-lora.png")}},
		{"gpt2 lora", []string{"--model", "gpt2", "--mode", "lora"},
			[]string{"== lora ==", "lora adapters: 336 GEMMs (unfused)", "--mode lora", "--dense-params device --lora-r 8", "fastest that fits: lora"}},
		// Fewer targets and a higher rank: two of the seven matrices per
		// layer, and the answer keeps both flags.
		{"llama-7b lora flags", []string{"--model", "llama-7b", "--mode", "lora", "--lora-r", "16", "--lora-targets", "q_proj,v_proj", "--recompute", "none"},
			[]string{"lora adapters: 448 GEMMs (unfused)", "--lora-r 16 --lora-targets q_proj,v_proj"}},
		{"llama-7b recompute none", []string{"--model", "llama-7b", "--gpu", "rtx4090", "--mode", "lsp", "--batch", "2", "--seq-len", "2048", "--recompute", "none"},
			[]string{"recompute (--recompute none)", "needs --recompute layer to fit", "does NOT fit", "no (device)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, stdout, stderr := runCmd(t, append([]string{"plan"}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("took %v, want under 30 s", d)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("output lacks %q:\n%s", w, stdout)
				}
			}
		})
	}
	for _, name := range []string{"tl-native.png", "tl-zero.png", "tl-lsp.png", "tl-lora.png", "all-lora.png", "one.png"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(f); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		f.Close()
	}
}

// planOutput runs lsp-train plan with args and returns its stdout,
// failing t at once unless it exits 0, and for each of want it lacks.
func planOutput(t *testing.T, args []string, want ...string) string {
	t.Helper()
	code, stdout, stderr := runCmd(t, append([]string{"plan"}, args...)...)
	if code != 0 {
		t.Fatalf("plan %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout, stderr)
	}
	for _, w := range want {
		if !strings.Contains(stdout, w) {
			t.Errorf("plan %s: output lacks %q:\n%s", strings.Join(args, " "), w, stdout)
		}
	}
	return stdout
}

// TestPlanCPU: --gpu cpu from a calibration file (bench/calibrate's JSON)
// plans the CPU backend with its measured figures and the link charge.
func TestPlanCPU(t *testing.T) {
	c := calibrate.CPU{Threads: 2, SIMD: "test", GemmPeak: 50e9,
		GemmSquares: []calibrate.GemmSample{{Shape: calibrate.GemmShape{M: 64, N: 64, K: 64}, Seconds: 2 * 64 * 64 * 64 / 50e9, Rate: 50e9}},
		Memory:      calibrate.Memory{Triad: 10e9},
		Overhead:    calibrate.Overhead{Op: 1e-6, RoundTrip: 5e-6, RecordWait: 2e-6},
		Link:        calibrate.Link{H2D: 4e9, D2H: 4e9, H2DLatency: 1e-6, D2HLatency: 1e-6, Bytes: 1 << 20},
		HostAdam:    calibrate.HostAdam{BytesPerParam: 32, Rate: 2e8, Overhead: 20e-6}}
	path := tempJSON(t, "cpu.json", c)
	planOutput(t, []string{"--gpu", "cpu", "--calibration", path, "--model", "tiny", "--seq-len", "16",
		"--batch", "2", "--dtype", "fp32", "--link-bandwidth", "1GB", "--device-mem", "1GiB"},
		"CPU backend, 2 threads (test)", "charged 1 GB/s", "1.00 GiB memory", "== lsp ==", "tokens/s")
}

func TestPlanCommandErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"unknown gpu", []string{"--gpu", "rtx9999"}, []string{"--gpu:", "rtx9999", "rtx4090"}},
		{"unknown link", []string{"--link", "usb"}, []string{"--link:", "usb"}},
		{"unknown host", []string{"--host", "mainframe"}, []string{"--host:", "mainframe"}},
		{"unknown model", []string{"--model", "gpt5"}, []string{"--model:", "gpt5"}},
		{"seq-len over the context", []string{"--model", "gpt2", "--seq-len", "2048"}, []string{"--seq-len:", "1024"}},
		{"batch 0", []string{"--batch", "0"}, []string{"--batch:"}},
		{"grad-accum 0", []string{"--grad-accum", "0"}, []string{"--grad-accum:"}},
		{"bad dtype", []string{"--dtype", "fp8"}, []string{"--dtype:", "fp8"}},
		{"bad mode", []string{"--mode", "fast"}, []string{"--mode:", "fast"}},
		{"bad schedule", []string{"--schedule", "eager"}, []string{"--schedule:", "eager"}},
		{"bad recompute", []string{"--recompute", "mlp"}, []string{"--recompute:", "mlp", "none, attn or layer (or auto)"}},
		{"bad grad residency", []string{"--grad-residency", "some"}, []string{"--grad-residency:", "some", "auto, whole or ring"}},
		{"bad ranks", []string{"--ranks", "0"}, []string{"--ranks:", "0, want at least 1"}},
		{"bad net", []string{"--ranks", "2", "--net", "token-ring"}, []string{"--net:", "token-ring", "10gbe"}},
		{"bad dense params", []string{"--dense-params", "gpu"}, []string{"--dense-params:", "gpu"}},
		{"bad lsp r", []string{"--mode", "lsp", "--d", "64", "--r", "0"}, []string{"--r"}},
		{"bad lora r", []string{"--mode", "lora", "--lora-r", "0"}, []string{"--lora-r:", "at least 1"}},
		{"lora target the model lacks", []string{"--model", "llama-7b", "--lora-targets", "q_proj,c_fc"}, []string{"--lora-targets:", "no module c_fc", "q_proj, k_proj"}},
		{"bad size", []string{"--host-bw", "fast"}, []string{"host-bw", "fast"}},
		{"two errors at once", []string{"--batch", "0", "--gpu", "x"}, []string{"--batch:", "--gpu:"}},
		{"cpu with a link preset", []string{"--gpu", "cpu", "--link", "pcie3"}, []string{"--link, --host:", "--gpu cpu"}},
		{"gpu with a missing calibration", []string{"--gpu", "h100", "--calibration", "/nonexistent/c.json"}, []string{"--calibration:", "/nonexistent/c.json"}},
		{"threads without cpu", []string{"--threads", "2"}, []string{"--threads", "only with --gpu cpu"}},
		{"cpu with a bad budget", []string{"--gpu", "cpu", "--calibrate-budget", "0s"}, []string{"--calibrate-budget:"}},
		{"cpu with a missing calibration", []string{"--gpu", "cpu", "--calibration", "/nonexistent/c.json"}, []string{"--calibration:", "/nonexistent/c.json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, append([]string{"plan"}, tc.args...)...)
			if code != 1 || stdout != "" {
				t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
		})
	}
}

// TestPlanLlama7BResources: `plan --model llama-7b` as a process of its
// own stays under 30 s and 1 GB of peak resident memory (its maximum
// RSS, from the kernel's rusage).
func TestPlanLlama7BResources(t *testing.T) {
	skipChildProcesses(t)
	var stdout, stderr bytes.Buffer
	start := time.Now()
	cmd := startChild(t, t.TempDir(), []string{"plan", "--model", "llama-7b", "--timeline", "tl.png"}, &stdout, &stderr)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	elapsed := time.Since(start)
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		t.Skip("no rusage on this system")
	}
	rss := ru.Maxrss << 10 // KiB on Linux
	t.Logf("plan --model llama-7b: %v, peak RSS %d MiB", elapsed, rss>>20)
	if elapsed > 30*time.Second {
		t.Errorf("took %v, want under 30 s", elapsed)
	}
	if rss > 1<<30 {
		t.Errorf("peak RSS %d MiB, want under 1 GiB", rss>>20)
	}
	if !strings.Contains(stdout.String(), "== lsp ==") {
		t.Errorf("output:\n%s", stdout.String())
	}
}

// TestPlanBudgetIsTheBackends: a preset's budget is what the CUDA
// backend's arena takes, the card less its CUDA context less
// backend.DeviceHeadroom of the rest, not the whole card; so gpt2-xl in
// zero mode, 3.82 GiB with --recompute layer, does not fit the 4 GB
// laptop card (3.36 GiB usable), and fits a --device-mem of 4 GiB, which
// the backend's arena then is, at the preset's speeds; the header says
// which figures are datasheet ones.
func TestPlanBudgetIsTheBackends(t *testing.T) {
	for name, g := range plan.GPUs {
		m, err := plan.Preset(name, "", "")
		if err != nil {
			t.Fatal(err)
		}
		free := m.GPU.Memory - m.GPU.Context
		if want := free - backend.DeviceHeadroom(free); m.GPU.Budget() != want || m.GPU.Context <= 0 || want <= 0 {
			t.Errorf("%s: budget %d bytes (context %d), want %d of the card's %d", name, m.GPU.Budget(), m.GPU.Context, want, g.Memory)
		}
	}
	args := []string{"plan", "--model", "gpt2-xl", "--gpu", "A1000", "--mode", "zero"} // a spelling of a1000-laptop
	for _, tc := range []struct {
		extra []string
		want  []string
	}{
		{nil, []string{"device memory 3.82 GiB of 3.36 GiB usable (the card's 4.00 GiB less 400.00 MiB of CUDA context and 256.00 MiB the backend leaves to CUDA): does NOT fit", "no (device)",
			"figures: the GPU's peaks, bandwidths and the link from datasheets", "nothing measured on a GPU"}},
		{[]string{"--device-mem", "4GiB"}, []string{"device memory 3.82 GiB of 4.00 GiB (--device-mem): fits",
			"--device-mem 4.00 GiB: the speeds of the NVIDIA RTX A1000 Laptop 4 GB with that budget"}},
	} {
		code, stdout, stderr := runCmd(t, append(args, tc.extra...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s\n%s", tc.extra, code, stdout, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stdout, w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.extra, w, stdout)
			}
		}
	}
}

// TestPlanQLoRA7B: QLoRA's case, llama-7b's lora at 1 x 1024 on an NF4
// base (--base-dtype nf4), fits a 12 GB card (rtx3060) as the preset
// trains it (the dense parameters on the device), and an 8 GB one
// (rtx4060) with them frozen, as from a checkpoint directory; the bf16
// base does not fit the 12 GB card (its block matrices alone are 12.06 GiB).
func TestPlanQLoRA7B(t *testing.T) {
	for _, tc := range []struct {
		gpu, dense, base string
		fits             bool
	}{
		{"rtx3060", "", "nf4", true},
		{"rtx4060", "frozen", "nf4", true},
		{"rtx3060", "", "", false},
	} {
		args := []string{"plan", "--model", "llama-7b", "--mode", "lora", "--batch", "1", "--seq-len", "1024", "--gpu", tc.gpu}
		if tc.dense != "" {
			args = append(args, "--dense-params", tc.dense)
		}
		if tc.base != "" {
			args = append(args, "--base-dtype", tc.base)
		}
		code, stdout, stderr := runCmd(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, stdout, stderr)
		}
		table := stdout[strings.Index(stdout, "  mode  recompute"):]
		row := strings.Fields(strings.Split(table, "\n")[1])
		if fits := row[len(row)-6] == "yes"; fits != tc.fits {
			t.Errorf("%v: fits %v, want %v:\n%s", args, fits, tc.fits, stdout)
		}
		if strings.Contains(stdout, "quantized base (nf4)") != (tc.base == "nf4") {
			t.Errorf("%v: the plan's parts:\n%s", args, stdout)
		}
	}
}
