package model

import (
	"slices"
	"strings"
	"testing"
)

// ringLayout: an embedding (10 x 4), three blocks of 6, a final norm of
// 4 and, untied, a head of 10 x 4; tied, the embedding is the head.
func ringLayout(tied bool) []Param {
	var ps []Param
	off := 0
	add := func(name string, layer int, pass Pass, shape ...int) {
		p := Param{Name: name, Shape: shape, Offset: off, Layer: layer, Backward: pass}
		off += p.Len()
		ps = append(ps, p)
	}
	emb := ByEmbed
	if tied {
		emb |= ByHead
	}
	add("emb", -1, emb, 10, 4)
	for l := range 3 {
		add("w", l, 0, 2, 2)
		add("b", l, 0, 2)
	}
	add("norm", -1, ByHead, 4)
	if !tied {
		add("head", -1, ByHead, 10, 4)
	}
	return ps
}

func TestGradRing(t *testing.T) {
	r, err := NewGradRing(ringLayout(false), 3, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	// head (44) slot 0, layer 2 slot 1, layer 1 slot 0, layer 0 slot 1,
	// embeddings (40) slot 0; slots as long as the head.
	var names []string
	var slots []int
	for _, g := range r.Groups {
		names, slots = append(names, g.Name), append(slots, g.Slot)
	}
	if !slices.Equal(names, []string{"head", "layer 2", "layer 1", "layer 0", "embeddings"}) || !slices.Equal(slots, []int{0, 1, 0, 1, 0}) {
		t.Fatalf("groups %v in slots %v", names, slots)
	}
	if r.SlotLen != 44 || r.Resident != 0 || r.Len != 88 {
		t.Fatalf("slot %d, resident %d, length %d; want 44, 0, 88", r.SlotLen, r.Resident, r.Len)
	}
	// The head group: norm then head, back to back at slot 0; layer 2 at
	// slot 1; the embedding at slot 0.
	if want := []int{0, 44, 48, 0, 4, 44, 48, 0, 4}; !slices.Equal(r.Offsets, want) {
		t.Fatalf("offsets %v, want %v", r.Offsets, want)
	}

	// Tied: the embedding is written from BackwardHead to BackwardEmbed
	// and stays resident, ahead of the slots.
	r, err = NewGradRing(ringLayout(true), 3, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	last := r.Groups[len(r.Groups)-1]
	if !last.Resident() || last.Name != "embeddings" || last.Off != 0 || last.Len != 40 || r.Resident != 40 {
		t.Fatalf("resident group %+v, region %d", last, r.Resident)
	}
	if r.SlotLen != 6 || r.Len != 40+3*6 || r.Groups[0].Name != "head" || r.Groups[0].Off != 40 || r.Groups[3].Slot != 0 {
		t.Fatalf("ring %+v", r)
	}

	// Skipped parameters have no place; a whole-gradient layout is
	// GradOffsets'.
	r, err = NewGradRing(ringLayout(false), 3, 2, func(i int) bool { return i == 1 || i == 3 || i == 5 })
	if err != nil {
		t.Fatal(err)
	}
	if r.Offsets[1] != -1 || r.SlotLen != 44 {
		t.Fatalf("skipped: offsets %v, slot %d", r.Offsets, r.SlotLen)
	}
	offs, n, err := GradLayout(ringLayout(false), 3, Options{}, nil)
	if want, wn := GradOffsets(ringLayout(false), nil); err != nil || !slices.Equal(offs, want) || n != wn {
		t.Fatalf("GradLayout without slots: %v %d %v", offs, n, err)
	}
}

func TestGradRingRefuses(t *testing.T) {
	unsaid := ringLayout(false)
	unsaid[len(unsaid)-1].Backward = 0
	inBlock := ringLayout(false)
	inBlock[1].Backward = ByHead
	for _, tc := range []struct {
		layout []Param
		slots  int
		want   string
	}{
		{unsaid, 2, "does not say which backward pass"},
		{inBlock, 2, "says a pass outside the blocks"},
		{ringLayout(false), 0, "0 slots"},
	} {
		if _, err := NewGradRing(tc.layout, 3, tc.slots, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one with %q", err, tc.want)
		}
	}
}
