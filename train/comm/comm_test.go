package comm

import (
	"math"
	"strings"
	"testing"
)

// TestShard checks that the shards tile [0, n) in rank order with lengths
// that differ by at most one, for sizes not divisible by the world size
// and smaller than it.
func TestShard(t *testing.T) {
	for size := 1; size <= 5; size++ {
		for n := 0; n <= 13; n++ {
			next, minLen, maxLen := 0, n, 0
			for r := 0; r < size; r++ {
				lo, hi := Shard(n, size, r)
				if lo != next || hi < lo {
					t.Fatalf("Shard(%d, %d, %d) = [%d, %d), want it to start at %d", n, size, r, lo, hi, next)
				}
				next = hi
				minLen, maxLen = min(minLen, hi-lo), max(maxLen, hi-lo)
			}
			if next != n || maxLen-minLen > 1 {
				t.Fatalf("n=%d size=%d: shards end at %d, lengths %d..%d", n, size, next, minLen, maxLen)
			}
		}
	}
}

// TestSumInRankOrder checks the order of the sum against values where the
// order changes the bits: (1e8 + 1) - 1e8 is 0 in float32, 1e8 - 1e8 + 1 is 1;
// and -0 + -0 stays -0 (the sum starts from rank 0's value, not from +0).
func TestSumInRankOrder(t *testing.T) {
	nz := float32(math.Copysign(0, -1)) // Go's constant -0.0 is +0
	a := []float32{1e8, 1, nz}
	b := []float32{1, 1e8, nz}
	c := []float32{-1e8, -1e8, nz}
	dst := make([]float32, 3)
	if err := SumInRankOrder(dst, a, b, c); err != nil {
		t.Fatal(err)
	}
	want := []float32{0, 0, nz}
	for i := range want {
		if math.Float32bits(dst[i]) != math.Float32bits(want[i]) {
			t.Errorf("dst[%d] = %v (%#x), want %v (%#x)", i, dst[i], math.Float32bits(dst[i]), want[i], math.Float32bits(want[i]))
		}
	}
	// Another order gives other bits, so the check above can fail.
	if err := SumInRankOrder(dst, a, c, b); err != nil {
		t.Fatal(err)
	}
	if dst[0] != 1 {
		t.Errorf("a+c+b: dst[0] = %v, want 1", dst[0])
	}
	// dst may be parts[0], not a later part.
	if err := SumInRankOrder(a, a, b); err != nil {
		t.Fatal(err)
	}
	if err := SumInRankOrder(b, a, b); err == nil || !strings.Contains(err.Error(), "overlaps part 1") {
		t.Errorf("dst aliasing part 1: err = %v", err)
	}
	if err := SumInRankOrder(dst, a[:2]); err == nil {
		t.Error("short part: no error")
	}
}

func TestSingle(t *testing.T) {
	var c Communicator = NewSingle()
	if c.Rank() != 0 || c.Size() != 1 {
		t.Fatalf("rank %d size %d", c.Rank(), c.Size())
	}
	x := []float32{1, 2, 3}
	if err := c.AllReduceSum(x); err != nil || x[0] != 1 || x[2] != 3 {
		t.Fatalf("AllReduceSum: %v %v", x, err)
	}
	sh := make([]float32, 3)
	if err := c.ReduceScatterSum(sh, x); err != nil || sh[1] != 2 {
		t.Fatalf("ReduceScatterSum: %v %v", sh, err)
	}
	if err := c.ReduceScatterSum(x[:2], x); err == nil {
		t.Error("ReduceScatterSum with a short shard: no error")
	}
	if err := c.ReduceScatterSum(x, x); err == nil {
		t.Error("ReduceScatterSum with shard = x: no error")
	}
	y := make([]float32, 3)
	if err := c.AllGather(y, sh); err != nil || y[2] != 3 {
		t.Fatalf("AllGather: %v %v", y, err)
	}
	if err := c.AllGather(y, y); err != nil {
		t.Fatalf("AllGather in place: %v", err)
	}
	if err := c.Broadcast([]byte{1}, 1); err == nil || !strings.Contains(err.Error(), "root 1 out of range") {
		t.Errorf("Broadcast from root 1: %v", err)
	}
	if err := BroadcastInt32(c, []int32{4}, 0); err != nil {
		t.Error(err)
	}
	if err := BroadcastFloat32(c, nil, 0); err != nil {
		t.Error(err)
	}
	if err := c.Barrier(); err != nil {
		t.Error(err)
	}
	st := c.Stats()
	if st.Ops[AllReduce].Calls != 1 || st.Ops[ReduceScatter].Calls != 1 || st.Ops[Broadcast].Calls != 2 || st.Sent() != 0 || st.Received() != 0 {
		t.Errorf("stats %+v", st)
	}
	if d := st.Sub(st); d.Ops[Broadcast].Calls != 0 {
		t.Errorf("Sub: %+v", d)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Barrier(); err == nil {
		t.Error("Barrier after Close: no error")
	}
}

func TestLaunchedByMPI(t *testing.T) {
	t.Setenv(WorldEnv, "3")
	if n, ok := LaunchedByMPI(); !ok || n != 3 {
		t.Errorf("LaunchedByMPI = %d, %v", n, ok)
	}
}
