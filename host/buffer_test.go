// buffer_test.go: off-heap host buffers: alignment, zeroing, views and their
// bounds, the huge-page advice and mlock (read back from /proc/self/smaps),
// and Free.

package host

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// hostBufferVMFlags returns the VmFlags line of the mapping that contains
// addr, from /proc/self/smaps (the kernel may merge neighbouring mappings
// with equal flags, so the mapping need not start at addr).
func hostBufferVMFlags(t *testing.T, addr uintptr) string {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uintptr
		if fields := strings.Fields(line); len(fields) > 1 && !strings.HasSuffix(fields[0], ":") {
			if _, err := fmt.Sscanf(fields[0], "%x-%x", &lo, &hi); err == nil {
				in = lo <= addr && addr < hi
				continue
			}
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return line + " "
		}
	}
	t.Fatalf("no mapping contains %#x in /proc/self/smaps", addr)
	return ""
}

func TestHostBufferAlignmentAndViews(t *testing.T) {
	for _, size := range []int{1, 4096, 3<<20 + 6} {
		b, err := NewHostBuffer(size, HostBufferOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if uintptr(b.Ptr())%HostBufferAlign != 0 {
			t.Errorf("size %d: start %p not 2 MiB aligned", size, b.Ptr())
		}
		if b.Len() != size || len(b.Bytes()) != size {
			t.Errorf("size %d: Len %d, len(Bytes) %d", size, b.Len(), len(b.Bytes()))
		}
		for i, x := range b.Bytes() {
			if x != 0 {
				t.Fatalf("size %d: byte %d = %d, want zeroed memory", size, i, x)
			}
		}
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
	}

	b, err := NewHostBuffer(1<<20, HostBufferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	f, err := b.Float32s(8, 100)
	if err != nil {
		t.Fatal(err)
	}
	u, err := b.Uint16s(8, 4)
	if err != nil {
		t.Fatal(err)
	}
	f[0] = 1 // 0x3f800000: little-endian halves 0x0000, 0x3f80
	if u[0] != 0 || u[1] != 0x3f80 || cap(f) != 100 {
		t.Errorf("views do not alias: u = %v, cap(f) = %d", u[:2], cap(f))
	}
	if last, err := b.Float32s(1<<20-4, 1); err != nil || len(last) != 1 {
		t.Errorf("last float: %v, %v", last, err)
	}
	if empty, err := b.Uint16s(1<<20, 0); err != nil || len(empty) != 0 {
		t.Errorf("empty view at the end: %v, %v", empty, err)
	}
	for _, c := range []struct {
		name   string
		off, n int
		f32    bool
	}{
		{"past the end", 1<<20 - 4, 2, true},
		{"misaligned float", 2, 1, true},
		{"misaligned uint16", 1, 1, false},
		{"negative offset", -4, 1, true},
		{"negative length", 0, -1, false},
		{"offset past the end", 1<<20 + 2, 0, false},
	} {
		var err error
		if c.f32 {
			_, err = b.Float32s(c.off, c.n)
		} else {
			_, err = b.Uint16s(c.off, c.n)
		}
		if err == nil {
			t.Errorf("%s: view (%d, %d) accepted", c.name, c.off, c.n)
		}
	}
	if _, err := NewHostBuffer(0, HostBufferOptions{}); err == nil {
		t.Error("size 0 accepted")
	}
}

func TestHostBufferAdviceAndLock(t *testing.T) {
	b, err := NewHostBuffer(4<<20, HostBufferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	if flags := hostBufferVMFlags(t, uintptr(b.Ptr())); !strings.Contains(flags, " hg ") {
		t.Errorf("no huge-page advice (hg) on the mapping: %s", flags)
	}
	n, err := NewHostBuffer(2<<20, HostBufferOptions{NoHugePages: true})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Free()
	if flags := hostBufferVMFlags(t, uintptr(n.Ptr())); strings.Contains(flags, " hg ") {
		t.Errorf("NoHugePages mapping advised anyway: %s", flags)
	}

	l, err := NewHostBuffer(2<<20, HostBufferOptions{Lock: true})
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EAGAIN) {
		// What mlock answers when RLIMIT_MEMLOCK or the privileges forbid
		// it; any other error is a bug of Lock, not of the machine.
		t.Skipf("mlock not permitted here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer l.Free()
	if !l.Locked() {
		t.Error("Locked() = false after a successful Lock")
	}
	if flags := hostBufferVMFlags(t, uintptr(l.Ptr())); !strings.Contains(flags, " lo ") {
		t.Errorf("locked buffer lacks the lo flag: %s", flags)
	}
}

func TestHostBufferFree(t *testing.T) {
	b, err := NewHostBuffer(100, HostBufferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); err != nil {
		t.Errorf("second Free: %v", err)
	}
	if _, err := b.Float32s(0, 1); err == nil {
		t.Error("view of a freed buffer accepted")
	}
	if b.Ptr() != nil || b.Len() != 0 {
		t.Errorf("freed buffer: Ptr %p, Len %d", b.Ptr(), b.Len())
	}
}
