package hazard

import (
	"runtime"
	"strconv"
	"strings"
)

// GoroutineID is the id of the calling goroutine. Go does not expose it;
// the first line of the goroutine's stack trace holds it, which is slow
// but paid only by the checks of a test mode.
func GoroutineID() uint64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	s := strings.TrimPrefix(string(buf[:n]), "goroutine ")
	if i := strings.IndexByte(s, ' '); i > 0 {
		if id, err := strconv.ParseUint(s[:i], 10, 64); err == nil {
			return id
		}
	}
	return 0
}
