//go:build cuda || cudasim

package cuda

import "os"

// childEnv names the test a child process runs (see runChild): a test
// that poisons the device (a sticky error stays for the process's life)
// runs in a child of its own.
const childEnv = "LSP_CUDA_TEST_CHILD"

func inChild() bool { return os.Getenv(childEnv) != "" }
