//go:build cudasim

// cast.cc: compiles kernels/cast.cu (LSP_LAUNCH queues its grids under
// -DLSP_CUDASIM) into this cgo package.
#include "../cast.cu"
