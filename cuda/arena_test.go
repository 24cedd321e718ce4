// Tests of what needs no CUDA: the arena's allocator, the capability
// check, the choice of device and the out-of-memory message. They run in
// every build (under -tags cuda with no GPU TestMain skips them with the
// rest).

package cuda

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestArenaFirstFitAndCoalescing(t *testing.T) {
	a := newArena(10 * arenaAlign)
	off := func(n int64) int64 {
		t.Helper()
		o, ok := a.alloc(n)
		if !ok {
			t.Fatalf("alloc(%d) failed with free list %v", n, a.free)
		}
		return o
	}
	x, y, z := off(1), off(arenaAlign+1), off(3*arenaAlign)
	if x != 0 || y != arenaAlign || z != 3*arenaAlign {
		t.Fatalf("offsets %d %d %d, want 0, %d, %d (first fit, rounded to %d)", x, y, z, arenaAlign, 3*arenaAlign, arenaAlign)
	}
	if o, ok := a.alloc(0); !ok || o != 0 {
		t.Errorf("alloc(0) = %d, %v; want 0, true (takes no space)", o, ok)
	}
	if _, ok := a.alloc(5 * arenaAlign); ok {
		t.Errorf("alloc of 5 blocks fit in the 4 left")
	}
	a.release(y, arenaAlign+1) // a hole of 2 blocks between x and z
	if o := off(arenaAlign); o != arenaAlign {
		t.Errorf("first fit took offset %d, want the hole at %d", o, arenaAlign)
	}
	a.release(arenaAlign, arenaAlign)
	a.release(x, 1)
	a.release(z, 3*arenaAlign)
	if len(a.free) != 1 || a.free[0] != (span{0, 10 * arenaAlign}) {
		t.Errorf("after freeing everything the free list is %v, want one span of the whole arena", a.free)
	}
	if total, largest := a.freeBytes(); total != 10*arenaAlign || largest != total {
		t.Errorf("freeBytes = %d, %d", total, largest)
	}
}

// TestArenaRandom allocates and frees at random and checks the invariants:
// blocks never overlap, stay inside the arena, and the free list stays
// sorted and coalesced, its total the arena less what is live.
func TestArenaRandom(t *testing.T) {
	const size = 1 << 20
	a := newArena(size)
	r := rand.New(rand.NewPCG(1, 2))
	type block struct{ off, n int64 }
	var live []block
	var used int64
	for range 5000 {
		if len(live) > 0 && r.IntN(2) == 0 {
			i := r.IntN(len(live))
			a.release(live[i].off, live[i].n)
			used -= roundUp(live[i].n)
			live = append(live[:i], live[i+1:]...)
		} else {
			n := int64(r.IntN(40000))
			o, ok := a.alloc(n)
			if !ok {
				if _, largest := a.freeBytes(); largest >= roundUp(n) {
					t.Fatalf("alloc(%d) failed with a free span of %d", n, largest)
				}
				continue
			}
			if o%arenaAlign != 0 || o+n > size {
				t.Fatalf("block [%d,+%d) misaligned or outside the arena", o, n)
			}
			for _, b := range live {
				if n > 0 && b.n > 0 && o < b.off+roundUp(b.n) && b.off < o+roundUp(n) {
					t.Fatalf("block [%d,+%d) overlaps [%d,+%d)", o, n, b.off, b.n)
				}
			}
			live = append(live, block{o, n})
			used += roundUp(n)
		}
		for i := 1; i < len(a.free); i++ {
			if p := a.free[i-1]; p.off+p.n >= a.free[i].off {
				t.Fatalf("free list not sorted and coalesced: %v", a.free)
			}
		}
		if total, _ := a.freeBytes(); total != size-used {
			t.Fatalf("free %d, want %d", total, size-used)
		}
	}
}

func TestCheckCapability(t *testing.T) {
	for _, tc := range []struct {
		major, minor int
		ok           bool
	}{{7, 5, false}, {7, 0, false}, {6, 1, false}, {8, 0, true}, {8, 6, true}, {9, 0, true}, {10, 0, true}} {
		d := DeviceInfo{Ordinal: 1, Name: "Made-up GPU", Major: tc.major, Minor: tc.minor}
		err := CheckCapability(d)
		if tc.ok != (err == nil) {
			t.Errorf("sm_%d%d: %v, want ok=%v", tc.major, tc.minor, err, tc.ok)
			continue
		}
		if err != nil {
			for _, want := range []string{"device 1", "Made-up GPU", "compute capability " + d.Arch()[3:4] + "." + d.Arch()[4:], d.Arch(), "sm_80 or newer"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("sm_%d%d: %q does not say %q", tc.major, tc.minor, err, want)
				}
			}
		}
	}
}

func TestPick(t *testing.T) {
	if _, err := pick(nil, 0); !errors.Is(err, ErrNoDevice) {
		t.Errorf("no devices: %v, want ErrNoDevice", err)
	}
	devs := []DeviceInfo{{Ordinal: 0, Name: "new", Major: 9}, {Ordinal: 1, Name: "old", Major: 7, Minor: 5}}
	if d, err := pick(devs, 0); err != nil || d.Name != "new" {
		t.Errorf("pick 0 = %v, %v", d, err)
	}
	if _, err := pick(devs, 1); err == nil || !strings.Contains(err.Error(), "old") || !strings.Contains(err.Error(), "sm_75") {
		t.Errorf("pick of an sm_75 device: %v, want a refusal naming it and sm_75", err)
	}
	if _, err := pick(devs, 2); err == nil || !strings.Contains(err.Error(), "device 2 does not exist") || !strings.Contains(err.Error(), "cuda:1") {
		t.Errorf("pick 2 of 2: %v", err)
	}
}

func TestOutOfMemoryMessage(t *testing.T) {
	e := &OutOfMemoryError{Device: "device 0 (G)", What: "the device arena", Asked: 3 << 30, Free: 1 << 30, Where: "on the device", Hint: "lower --device-mem"}
	for _, want := range []string{"device 0 (G)", "asked 3221225472 bytes", "1073741824 bytes", "free on the device", "lower --device-mem"} {
		if !strings.Contains(e.Error(), want) {
			t.Errorf("%q does not say %q", e.Error(), want)
		}
	}
}
