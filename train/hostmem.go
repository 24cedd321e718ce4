// The host side of the memory check: the machine's available memory, the
// budget --host-mem gives instead, and how much Go heap garbage a run
// lets build up.

package train

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
)

// meminfoPath is where memAvailable reads; a variable for tests.
var meminfoPath = "/proc/meminfo"

// memAvailable is the kernel's estimate of the memory a new allocation
// can have without swapping (MemAvailable of /proc/meminfo, in bytes),
// and false where it is unknown (not Linux, or a kernel before 3.14).
func memAvailable() (int64, bool) {
	raw, err := os.ReadFile(meminfoPath)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 {
			return 0, false
		}
		return kb << 10, true
	}
	return 0, false
}

// checkHostMemory refuses a plan whose host peak is above --host-mem, or
// without it above the memory the machine has available, before anything
// large is allocated. Where neither is known nothing is checked.
func checkHostMemory(p Memory, hostMem int64) error {
	budget, what := hostMem, "the budget (--host-mem)"
	if budget == 0 {
		avail, ok := memAvailable()
		if !ok {
			return nil
		}
		budget, what = avail, "the memory this machine has available (MemAvailable in "+meminfoPath+"; --host-mem sets another budget)"
	}
	if need := p.HostPeak(); need > budget {
		return flagErr("host-mem", "the run needs %d bytes of host memory (%s) but %s is %d bytes; "+
			"lower --batch or --seq-len, use a smaller model, or on the cpu device (whose device memory is host memory) "+
			"use --mode lsp", need, p.HostString(), what, budget)
	}
	return nil
}

// boundGarbage lowers the Go collector's target, once a run's engine is
// allocated, so that the garbage between collections is at most goHeapHeadroom
// rather than as much as the live heap (GOGC=100), which on the CPU
// backend holds the device memory: the steps' garbage would otherwise
// grow for hundreds of steps to gigabytes. The returned func restores
// the setting. A GOGC in the environment is left as the user set it.
func boundGarbage() (restore func()) {
	if _, set := os.LookupEnv("GOGC"); set {
		return func() {}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	pct := 100
	if live := int64(ms.HeapAlloc); live > 0 {
		pct = int(max(1, min(100, 100*goHeapHeadroom/live)))
	}
	old := debug.SetGCPercent(pct)
	return func() { debug.SetGCPercent(old) }
}
