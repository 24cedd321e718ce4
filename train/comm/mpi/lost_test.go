package mpi

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestProcEnded follows a child process through its life: running, then
// killed but not yet reaped (a zombie: ended), then reaped (its pid names
// no process); a record with another start time is another process.
func TestProcEnded(t *testing.T) {
	if _, _, err := readProc(1); err != nil {
		t.Skipf("SKIP: no /proc: %v", err)
	}
	self, err := selfProc()
	if err != nil {
		t.Fatal(err)
	}
	if self.ended() {
		t.Fatalf("this process (%+v) counts as ended", self)
	}
	if (proc{self.pid, self.start + 1}).ended() == false {
		t.Errorf("pid %d with another start time counts as this process", self.pid)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("SKIP: cannot start sleep: %v", err)
	}
	defer cmd.Process.Kill()
	_, start, err := readProc(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	p := proc{cmd.Process.Pid, start}
	if p.ended() {
		t.Fatalf("running child %+v counts as ended", p)
	}
	if err := syscall.Kill(p.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Not waited for: a zombie once the kill lands.
	deadline := time.Now().Add(10 * time.Second)
	for !p.ended() {
		if time.Now().After(deadline) {
			state, _, err := readProc(p.pid)
			t.Fatalf("killed child %+v does not count as ended after 10 s (state %q, %v)", p, state, err)
		}
		time.Sleep(time.Millisecond)
	}
	if state, _, err := readProc(p.pid); err != nil || state != 'Z' {
		t.Errorf("killed child before its wait: state %q, %v; want a zombie", state, err)
	}
	cmd.Wait()
	if _, _, err := readProc(p.pid); err != errNoProc {
		t.Errorf("reaped child: readProc: %v, want errNoProc", err)
	}
	if !p.ended() {
		t.Errorf("reaped child counts as running")
	}
	if pidNamespace() == "" {
		t.Errorf("no pid namespace read from /proc/self/ns/pid")
	}
}
