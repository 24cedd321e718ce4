// Tests of the hazard mode: ordered producer/consumer pairs across streams
// pass, and every missing edge (a Wait, a host Synchronize) is reported
// naming both accesses, whatever the seeded delays do.
//
// Runs that miss an edge are "poisoned" first (a failed op makes the
// backend skip every later op): the checker works when ops are enqueued,
// so it needs nothing to run, and running the unordered ops would be a real
// data race that -race would report instead of the checker.

package cpu

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

var hazardSeeds = []uint64{1, 2, 3, 4, 5}

// hazardPair is a hazard a test expects: op after prev, not ordered
// after it.
type hazardPair struct{ op, prev string }

// checkHazards synchronizes streams a and b of be, returning their errors,
// and fails unless the hazards be found are exactly want, in order; with
// want nil, none, and neither synchronize fails.
func checkHazards(t *testing.T, seed uint64, be *Backend, want []hazardPair, a, b backend.Stream) (errA, errB error) {
	t.Helper()
	errA, errB = be.Synchronize(a), be.Synchronize(b)
	got := be.Hazards()
	if want == nil {
		if errA != nil || errB != nil || len(got) > 0 {
			t.Fatalf("seed %d: unexpected hazards %v (%v, %v)", seed, got, errA, errB)
		}
		return errA, errB
	}
	if len(got) != len(want) {
		t.Fatalf("seed %d: hazards %v, want %v", seed, got, want)
	}
	for i, w := range want {
		if got[i].Op != w.op || got[i].Prev != w.prev {
			t.Errorf("seed %d: hazard %v, want %q after %q", seed, got[i], w.op, w.prev)
		}
	}
	return errA, errB
}

// poison makes every later non-control op of be a no-op: an encoder op with
// a token id outside the vocabulary fails, and failures are sticky.
func poison(t *testing.T, be *Backend) {
	t.Helper()
	s := newStream(t, be, "poison")
	inp := intsOf(t, be, "bad ids", []int32{99})
	out, wte, wpe := alloc(t, be, "o", 1, backend.F32), alloc(t, be, "wte", 1, backend.F32), alloc(t, be, "wpe", 1, backend.F32)
	ok(t, be.EncoderForward(s, out, inp, backend.Tensor{}, wte, wpe, 1, 1, 1))
	if err := be.Synchronize(s); err == nil {
		t.Fatal("poisoning op did not fail")
	}
}

// hazardEnv is what one scenario works on: streams A and B, device tensors
// x, y, z of 10 fp32 each (filled with 0, 0, 0), a pinned buffer h of 10
// floats and an event e.
type hazardEnv struct {
	be      *Backend
	a, b    backend.Stream
	x, y, z backend.Tensor
	h       backend.HostBuffer
	e       backend.Event
}

func TestHazards(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, v hazardEnv)
		want []hazardPair // the hazards expected; nil: none (then y must hold 5s)
	}{
		{"RAW ordered by event", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.Fill(v.a, v.x, 5))
			ok(t, v.be.Record(v.e, v.a))
			ok(t, v.be.Wait(v.b, v.e))
			ok(t, v.be.CopyD2D(v.b, v.y, v.x))
		}, nil},
		{"RAW missing event", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.Fill(v.a, v.x, 5))
			ok(t, v.be.CopyD2D(v.b, v.y, v.x))
		}, []hazardPair{{"copy d2d", "fill"}}},
		{"WAR ordered by event", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.Fill(v.a, v.x, 5))
			ok(t, v.be.CopyD2D(v.a, v.y, v.x))
			ok(t, v.be.Record(v.e, v.a))
			ok(t, v.be.Wait(v.b, v.e))
			ok(t, v.be.Fill(v.b, v.x, 7))
		}, nil},
		{"WAR missing event", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.CopyD2D(v.a, v.y, v.x))
			ok(t, v.be.Fill(v.b, v.x, 7))
		}, []hazardPair{{"fill", "copy d2d"}}},
		{"WAW missing event", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.Fill(v.a, v.x, 5))
			ok(t, v.be.Scale(v.b, v.x, 2)) // both its read and its write conflict
		}, []hazardPair{{"scale", "fill"}, {"scale", "fill"}}},
		{"concurrent reads", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.Fill(v.a, v.x, 5))
			mustSync(t, v.be, v.a)
			ok(t, v.be.CopyD2D(v.a, v.y, v.x))
			ok(t, v.be.CopyD2D(v.b, v.z, v.x))
		}, nil},
		{"disjoint slices", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.Fill(v.a, v.y.Slice(0, 5), 5))
			ok(t, v.be.Fill(v.b, v.y.Slice(5, 5), 5))
		}, nil},
		{"overlapping slices", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.Fill(v.a, v.y.Slice(0, 6), 5))
			ok(t, v.be.Fill(v.b, v.y.Slice(5, 5), 5))
		}, []hazardPair{{"fill", "fill"}}},
		{"wait binds to the earlier record", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.Fill(v.a, v.x, 5))
			ok(t, v.be.Record(v.e, v.a))
			ok(t, v.be.Wait(v.b, v.e))
			ok(t, v.be.Scale(v.a, v.x, 3)) // after the record B waits for
			ok(t, v.be.Record(v.e, v.a))
			ok(t, v.be.CopyD2D(v.b, v.y, v.x))
		}, []hazardPair{{"copy d2d", "scale"}}},
		{"host synchronize orders streams", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.Fill(v.a, v.x, 5))
			mustSync(t, v.be, v.a)
			ok(t, v.be.CopyD2D(v.b, v.y, v.x))
		}, nil},
		{"host reads pinned before synchronize", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.CopyD2H(v.a, v.h, 0, v.x))
			v.be.HostAccess("host reads h", []backend.Range{hostRange(v.h, 0, 40)}, nil)
		}, []hazardPair{{"host reads h", "copy d2h"}}},
		{"host reads pinned after synchronize", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.Fill(v.a, v.x, 5))
			ok(t, v.be.CopyD2H(v.a, v.h, 0, v.x))
			mustSync(t, v.be, v.a)
			v.be.HostAccess("host reads h", []backend.Range{hostRange(v.h, 0, 40)}, nil)
			for i, f := range v.h.Float32() {
				if f != 5 {
					t.Fatalf("h[%d] = %v after synchronize, want 5", i, f)
				}
			}
			ok(t, v.be.CopyD2D(v.b, v.y, v.x))
		}, nil},
		{"host reads pinned after event synchronize", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.Fill(v.a, v.x, 5))
			ok(t, v.be.CopyD2H(v.a, v.h, 0, v.x))
			ok(t, v.be.Record(v.e, v.a))
			ok(t, v.be.EventSynchronize(v.e))
			v.be.HostAccess("host reads h", []backend.Range{hostRange(v.h, 0, 40)}, nil)
			ok(t, v.be.CopyD2D(v.b, v.y, v.x))
		}, nil},
		{"host writes pinned, then upload", func(t *testing.T, v hazardEnv) {
			v.be.HostAccess("host writes h", nil, []backend.Range{hostRange(v.h, 0, 40)})
			for i := range v.h.Float32() {
				v.h.Float32()[i] = 5
			}
			ok(t, v.be.CopyH2D(v.a, v.y, v.h, 0))
		}, nil},
		{"host rewrites pinned during upload", func(t *testing.T, v hazardEnv) {
			ok(t, v.be.CopyH2D(v.a, v.y, v.h, 0))
			v.be.HostAccess("host writes h", nil, []backend.Range{hostRange(v.h, 0, 40)})
		}, []hazardPair{{"host writes h", "copy h2d"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, seed := range hazardSeeds {
				be := newBE(t, Config{HazardCheck: true, MaxDelay: 200 * time.Microsecond, Seed: seed})
				if tc.want != nil {
					poison(t, be)
				}
				h, err := be.AllocHost("h", 40)
				ok(t, err)
				v := hazardEnv{be: be, a: newStream(t, be, "A"), b: newStream(t, be, "B"),
					x: alloc(t, be, "x", 10, backend.F32), y: alloc(t, be, "y", 10, backend.F32),
					z: alloc(t, be, "z", 10, backend.F32), h: h, e: newEvent(t, be, "e")}
				tc.run(t, v)
				errA, errB := checkHazards(t, seed, be, tc.want, v.a, v.b)
				if tc.want == nil {
					for i, f := range f32View(v.y) {
						if f != 5 {
							t.Fatalf("seed %d: y[%d] = %v, want 5", seed, i, f)
						}
					}
					continue
				}
				for _, err := range []error{errA, errB} {
					if err == nil || !strings.Contains(err.Error(), "hazard") ||
						!strings.Contains(err.Error(), fmt.Sprintf("%q", tc.want[0].op)) ||
						!strings.Contains(err.Error(), fmt.Sprintf("%q", tc.want[0].prev)) {
						t.Errorf("seed %d: synchronize: %v, want the hazard naming both ops", seed, err)
					}
				}
			}
		})
	}
}

// pipeline runs two iterations of upload (stream up), gelu (comp) and
// download (down) through shared device buffers x and y, ordered by the
// edges of a double-buffer-free schedule, then the host reads both outputs.
// skip names one edge to leave out ("" for none).
func pipeline(t *testing.T, be *Backend, skip string) (out [2][]float32, in [2][]float32) {
	const n = 37
	up, comp, down := newStream(t, be, "up"), newStream(t, be, "comp"), newStream(t, be, "down")
	xReady, xFree, yReady, yFree := newEvent(t, be, "xReady"), newEvent(t, be, "xFree"), newEvent(t, be, "yReady"), newEvent(t, be, "yFree")
	x, y := alloc(t, be, "x", n, backend.F32), alloc(t, be, "y", n, backend.F32)
	var hin, hout [2]backend.HostBuffer
	r := newRand(7)
	for i := range 2 {
		var err error
		hin[i], err = be.AllocHost(fmt.Sprintf("in%d", i), 4*n)
		ok(t, err)
		hout[i], err = be.AllocHost(fmt.Sprintf("out%d", i), 4*n)
		ok(t, err)
		in[i] = randVals(r, n, 3)
		copy(hin[i].Float32(), in[i])
	}
	edge := func(name string, i int, s backend.Stream, e backend.Event) {
		if skip != fmt.Sprintf("%s/%d", name, i) {
			ok(t, be.Wait(s, e))
		}
	}
	for i := range 2 {
		if i > 0 {
			edge("up waits comp", i, up, xFree) // WAR on x
		}
		ok(t, be.CopyH2D(up, x, hin[i], 0))
		ok(t, be.Record(xReady, up))
		edge("comp waits up", i, comp, xReady) // RAW on x
		if i > 0 {
			edge("comp waits down", i, comp, yFree) // WAR on y
		}
		ok(t, be.GeluForward(comp, y, x))
		ok(t, be.Record(xFree, comp))
		ok(t, be.Record(yReady, comp))
		edge("down waits comp", i, down, yReady) // RAW on y
		ok(t, be.CopyD2H(down, hout[i], 0, y))
		ok(t, be.Record(yFree, down))
	}
	if skip != "host syncs down" {
		// A run missing an edge is poisoned, so its Synchronize fails.
		if err := be.Synchronize(down); err != nil && skip == "" {
			t.Fatal(err)
		}
	}
	be.HostAccess("host reads outputs", []backend.Range{hostRange(hout[0], 0, 4*n), hostRange(hout[1], 0, 4*n)}, nil)
	if skip == "" {
		for i := range 2 {
			out[i] = append([]float32(nil), hout[i].Float32()...)
		}
	}
	return out, in
}

// TestScheduleEdges: the full pipeline has no hazard and computes gelu;
// deleting any one of its edges is reported.
func TestScheduleEdges(t *testing.T) {
	edges := []string{"comp waits up/0", "down waits comp/0", "up waits comp/1", "comp waits up/1",
		"comp waits down/1", "down waits comp/1", "host syncs down"}
	for _, seed := range hazardSeeds {
		be := newBE(t, Config{HazardCheck: true, MaxDelay: 200 * time.Microsecond, Seed: seed})
		out, in := pipeline(t, be, "")
		if h := be.Hazards(); len(h) > 0 {
			t.Fatalf("seed %d: full schedule has hazards %v", seed, h)
		}
		for i := range 2 {
			// fp32 gelu against float64: a few ulps.
			near(t, fmt.Sprintf("seed %d out%d", seed, i), out[i], gelu64(f64s(in[i])), 1e-6, 1e-6)
		}
	}
	for _, skip := range edges {
		t.Run(skip, func(t *testing.T) {
			be := newBE(t, Config{HazardCheck: true, Seed: 1})
			poison(t, be)
			pipeline(t, be, skip)
			if h := be.Hazards(); len(h) == 0 {
				t.Errorf("schedule without %q has no hazard", skip)
			}
		})
	}
}
