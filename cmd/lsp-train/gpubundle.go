// The GPU bundle's commands (make gpu-bundle, scripts/gpu-bundle.sh): the
// device query, the benchmarks and the test binaries the bundle carries,
// in the one binary that the bundle copies to a machine with only the
// NVIDIA driver. They are not in -h's list: they are the script's tools,
// not a user's workflow, and a build that is not a bundle has no tests to
// run.

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/lsp-offload/lsp-offload/bench/kernelbench"
	"github.com/lsp-offload/lsp-offload/bench/pciebench"
	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/plan"
)

// bundleCommands are the bundle's commands, by name (lsp-train NAME ...).
var bundleCommands = map[string]func(args []string, stdout io.Writer, stderr *os.File) error{
	"gpu-info": gpuInfoCmd,
	"gpu-test": gpuTestCmd,
	"bench-pcie": func(args []string, _ io.Writer, _ *os.File) error {
		return pciebench.Run(args)
	},
	"bench-kernels": func(args []string, _ io.Writer, _ *os.File) error {
		return kernelbench.Run(args)
	},
}

// gpuInfoProbe is the arena the device query opens: small, since only the
// context matters here.
const gpuInfoProbe = 64 << 20

// gpuInfoCmd prints CUDA device 0 and its CUDA context size
// (total - free memory when the backend opened, before its arena) beside
// what train/plan assumes, in a line of key=value pairs the script parses.
// With -calibration FILE it also writes the measured context into that
// GPU calibration file, which plan --calibration then reads.
func gpuInfoCmd(args []string, stdout io.Writer, stderr *os.File) error {
	fs := flag.NewFlagSet("lsp-train gpu-info", flag.ContinueOnError)
	calib := fs.String("calibration", "", "write the measured CUDA context into this GPU calibration `FILE` (from bench-kernels -calibration)")
	if err := parseSubcommandFlags(fs, args, stderr, "lsp-train gpu-info [flags]",
		"Lists the CUDA devices and measures device 0's CUDA context."); err != nil {
		return err
	}
	be, err := device.Open(device.Config{Kind: device.CUDA, MemBudget: gpuInfoProbe})
	if err != nil {
		return fmt.Errorf("opening cuda:0: %w", err)
	}
	defer be.Close()
	d, ok := be.(interface {
		Device() cuda.DeviceInfo
		MemAtOpen() (free, total int64)
	})
	if !ok {
		return fmt.Errorf("the %s backend describes no CUDA device", be.Name())
	}
	info := d.Device()
	fmt.Fprintf(stdout, "device: %v\n", info)
	if cudaSimulated {
		fmt.Fprintln(stdout, "SIMULATED: the simulated CUDA runtime (-tags cudasim); its context is not a GPU's")
	}
	free, total := d.MemAtOpen()
	preset, _ := plan.GPUName(info.Name)
	assumed := int64(0)
	if m, err := plan.Preset(preset, "", ""); err == nil {
		assumed = m.GPU.Context
	} else if m, err := plan.Preset("h100", "", ""); err == nil {
		assumed = m.GPU.Context // the same assumption for every preset
	}
	context := total - free
	fmt.Fprintf(stdout, "context: %s in use when the backend opened (total %s - free %s; another process on the device counts too), plan assumes %s\n",
		bytesText(context), bytesText(total), bytesText(free), bytesText(assumed))
	fmt.Fprintf(stdout, "gpu-info: device=%q arch=%s preset=%q total_bytes=%d context_bytes=%d plan_context_bytes=%d\n",
		info.Name, info.Arch(), preset, total, context, assumed)
	if *calib == "" || context <= 0 {
		return nil // nothing measured (the simulated runtime has no context)
	}
	c, err := plan.ReadGPUCalibration(*calib)
	if err != nil {
		return fmt.Errorf("-calibration: %w", err)
	}
	if cudaSimulated != c.Simulated {
		return errors.New("-calibration: measured on another runtime (simulated and real differ)")
	}
	c.Context = context
	if err := c.WriteFile(*calib); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "calibration: context %s written to %s\n", bytesText(context), *calib)
	return nil
}
