package mpi

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"
)

// LostError is the error of a collective that gave up on peers: their
// processes were seen to end (Ended), or nothing came from them for the
// communicator's timeout. Comm.Lost returns one too, outside a
// collective.
type LostError struct {
	Rank, Size int    // this process's rank, of Size
	Ranks      []int  // the ranks lost
	During     string // the collective ("AllReduceSum #3 of 1000 elements"); "" outside one
	Ended      bool   // their processes ended (else they were only silent)
	msg        string
}

func (e *LostError) Error() string { return e.msg }

// Wait is what the collective in progress waits for (Comm.Waiting).
type Wait struct {
	Op    string        // the collective, as errors name it
	Ranks []int         // the peers whose messages have not completed
	For   time.Duration // since the collective began
}

// proc names one process of this host: its pid and its start time in
// clock ticks after boot, which tell it from a later process given the
// same pid.
type proc struct {
	pid   int
	start uint64
}

// errNoProc is readProc's error for a pid that names no process.
var errNoProc = errors.New("no such process")

// readProc reads a process's state letter and start time from
// /proc/PID/stat (proc(5): the fields after the command's closing
// parenthesis are state, ppid, ..., the 22nd field overall is starttime).
func readProc(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, errNoProc
	}
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command in %q", pid, b)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields after the command, want 20 or more", pid, len(f))
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	return f[0][0], start, nil
}

// selfProc is this process.
func selfProc() (proc, error) {
	pid := os.Getpid()
	_, start, err := readProc(pid)
	return proc{pid, start}, err
}

// ended reports whether p has ended: its pid names no process, a zombie
// (killed, not yet reaped by its parent), or a later process. A /proc that
// cannot be read says nothing: not ended.
func (p proc) ended() bool {
	state, start, err := readProc(p.pid)
	if err == errNoProc {
		return true
	}
	if err != nil {
		return false
	}
	return state == 'Z' || state == 'X' || start != p.start
}

// pidNamespace names this process's pid namespace ("pid:[4026531836]"):
// a pid means the same process to two processes only inside one.
func pidNamespace() string {
	s, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	return s
}

// RanksText is how errors name ranks: "rank 1", or "ranks 1, 2".
func RanksText(rs []int) string {
	if len(rs) == 1 {
		return fmt.Sprintf("rank %d", rs[0])
	}
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprint(r)
	}
	return "ranks " + strings.Join(s, ", ")
}
