package model

import "fmt"

// GradGroup is one group of a gradient ring: the parameters whose
// gradients are complete after the same backward pass, in one contiguous
// region of Grads.
type GradGroup struct {
	Name  string
	Layer int // the block; -1: outside the blocks
	// Pass, outside the blocks: ByHead (complete after BackwardHead),
	// ByEmbed (after BackwardEmbed) or both (a tied head: written from
	// BackwardHead to BackwardEmbed, so it stays in the resident region).
	Pass   Pass
	Params []int // Layout indices, in Layout order
	// Slot is the group's ring slot; -1: the resident region.
	Slot     int
	Off, Len int // the group's region of Grads, in elements
}

// Resident reports whether the group lives outside the ring.
func (g GradGroup) Resident() bool { return g.Slot < 0 }

// GradRing lays the dense gradients out as a ring of slots (DeepSpeed's
// gradient buckets, ZeRO-Offload): in one micro-batch's backward the
// groups come in the order head (the final norm and an untied head),
// blocks L-1 .. 0, embeddings, and the j-th of them that has a gradient
// uses slot j % Slots, so that only Slots groups' gradients are on the
// device at once. A group written by both BackwardHead and BackwardEmbed
// (a head tied to the embedding) would hold a slot through the whole
// backward; it gets a resident region of its own before the slots
// instead, and keeps today's semantics there: zeroed once per step,
// accumulated over the micro-batches.
type GradRing struct {
	Groups   []GradGroup // in backward order; the resident group (if any) last
	Slots    int
	SlotLen  int   // elements per slot: the longest ring group's
	Resident int   // elements of the resident region, at offset 0
	Offsets  []int // by Layout index, in Grads; -1 where skip says
	Len      int   // Grads' elements: Resident + Slots*SlotLen
}

// NewGradRing lays out the gradients of layout (layers blocks) in a ring
// of slots >= 1 slots, leaving out the parameters skip reports (the block
// matrices under MatrixGrads). Every parameter outside the blocks must
// say which passes write it (Param.Backward).
func NewGradRing(layout []Param, layers, slots int, skip func(i int) bool) (GradRing, error) {
	if slots < 1 {
		return GradRing{}, fmt.Errorf("model: a gradient ring of %d slots", slots)
	}
	head := GradGroup{Name: "head", Layer: -1, Pass: ByHead}
	embed := GradGroup{Name: "embeddings", Layer: -1, Pass: ByEmbed}
	blocks := make([]GradGroup, layers)
	for l := range blocks {
		blocks[l] = GradGroup{Name: fmt.Sprintf("layer %d", l), Layer: l}
	}
	for i, p := range layout {
		switch {
		case skip != nil && skip(i):
		case p.Layer >= 0 && p.Layer < layers:
			if p.Backward != 0 {
				return GradRing{}, fmt.Errorf("model: %s of block %d says a pass outside the blocks writes it", p.Name, p.Layer)
			}
			blocks[p.Layer].Params = append(blocks[p.Layer].Params, i)
		case p.Layer != -1:
			return GradRing{}, fmt.Errorf("model: %s in block %d of %d", p.Name, p.Layer, layers)
		case p.Backward == ByHead:
			head.Params = append(head.Params, i)
		case p.Backward == ByEmbed || p.Backward == ByHead|ByEmbed:
			embed.Params = append(embed.Params, i)
			embed.Pass |= p.Backward
		default:
			return GradRing{}, fmt.Errorf("model: %s outside the blocks does not say which backward pass writes it", p.Name)
		}
	}
	seq := []GradGroup{head}
	for l := layers - 1; l >= 0; l-- {
		seq = append(seq, blocks[l])
	}
	seq = append(seq, embed)
	r := GradRing{Slots: slots, Offsets: make([]int, len(layout))}
	for i := range r.Offsets {
		r.Offsets[i] = -1
	}
	length := func(g GradGroup) int {
		n := 0
		for _, i := range g.Params {
			n += layout[i].Len()
		}
		return n
	}
	var resident []GradGroup
	j := 0
	for _, g := range seq {
		g.Len = length(g)
		switch {
		case g.Len == 0:
			continue
		case g.Pass == ByHead|ByEmbed:
			g.Slot = -1
			resident = append(resident, g)
			continue
		}
		g.Slot = j % slots
		j++
		r.SlotLen = max(r.SlotLen, g.Len)
		r.Groups = append(r.Groups, g)
	}
	for k := range resident {
		resident[k].Off = r.Resident
		r.Resident += resident[k].Len
	}
	for k := range r.Groups {
		r.Groups[k].Off = r.Resident + r.Groups[k].Slot*r.SlotLen
	}
	r.Groups = append(r.Groups, resident...)
	for _, g := range r.Groups {
		off := g.Off
		for _, i := range g.Params {
			r.Offsets[i] = off
			off += layout[i].Len()
		}
	}
	r.Len = r.Resident + slots*r.SlotLen
	return r, nil
}

// GradLayout places a model's dense gradients for opts: back to back in
// layout order (GradOffsets), or with opts.GradSlots in a ring
// (NewGradRing). skip reports the parameters without a dense gradient
// (the block matrices under MatrixGrads). The error is the ring's: a
// layout that does not say which pass writes a parameter outside the
// blocks.
func GradLayout(layout []Param, layers int, opts Options, skip func(i int) bool) (offs []int, n int, err error) {
	if opts.GradSlots == 0 {
		offs, n = GradOffsets(layout, skip)
		return offs, n, nil
	}
	r, err := NewGradRing(layout, layers, opts.GradSlots, skip)
	if err != nil {
		return nil, 0, err
	}
	return r.Offsets, r.Len, nil
}
