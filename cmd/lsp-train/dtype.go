// The default of --dtype depends on --device: bf16 on cuda, whose GEMM and
// attention kernels take nothing else, fp32 on the CPU (device.Kind's
// DefaultDType). It is resolved once both are parsed, so the run, its
// checkpoint and its resume identity all hold the resolved type.

package main

import (
	"flag"

	"github.com/lsp-offload/lsp-offload/train"
)

// defaultDType sets --dtype from --device when neither the command line nor
// the config file gave it.
func defaultDType(fs *flag.FlagSet, c *train.Config) {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "dtype" })
	if !given {
		c.DType = c.Device.DefaultDType()
	}
}
