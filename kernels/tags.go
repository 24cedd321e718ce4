//go:build (cuda && (lsp_sim || cudasim)) || (lsp_sim && cudasim)

package kernels

// The build tags cuda (a GPU), cudasim (the simulated CUDA runtime) and
// lsp_sim (the simulator tests) pick where the launchers run: at most one
// of them may be set. This undefined name stops such a build with its
// reason.
var _ = theBuildTagsCudaCudasimAndLspSimExcludeEachOther
