// Package gpubundle holds the GPU bundle's checks (make gpu-bundle, make
// cudasim-bundle-test): the bundle's binaries need nothing beyond the C
// library and the NVIDIA driver where they run, and its script
// (scripts/gpu-bundle.sh) writes a report that parses, skips what the
// budget does not allow and reports a failed stage with its log. The
// tests skip themselves unless the Makefile gives them a bundle.
package gpubundle
