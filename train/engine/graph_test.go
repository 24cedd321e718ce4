package engine

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

func nop(backend.Stream) error { return nil }

func TestReduceDropsImpliedEdges(t *testing.T) {
	g := &Graph{}
	a := g.Add("a", Compute, nop)
	b := g.Add("b", D2H, nop, a)
	c := g.Add("c", D2H, nop, a) // implied: a -> b -> c (queue order)
	h := g.Add("h", Host, nop, b, c)
	d := g.Add("d", H2D, nop, h)
	g.Add("e", Compute, nop, d, a) // a -> e is the compute queue's order: not an edge Validate accepts
	if err := g.Validate(); err == nil {
		t.Fatal("Validate accepted an edge within a queue")
	}
	g.Nodes[len(g.Nodes)-1].Deps = []NodeID{d, b} // b -> e is implied through h and d
	r := g.Reduce()
	want := map[[2]string]bool{{"a", "b"}: true, {"c", "h"}: true, {"h", "d"}: true, {"d", "e"}: true}
	got := map[[2]string]bool{}
	for _, e := range r.Edges() {
		got[[2]string{r.Nodes[e.From].Name, r.Nodes[e.To].Name}] = true
	}
	if len(got) != len(want) {
		t.Fatalf("reduced edges %v, want %v", got, want)
	}
	for e := range want {
		if !got[e] {
			t.Errorf("missing %v in %v", e, got)
		}
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(g.Without(Edge{From: a, To: b}).Nodes[b].Deps) != 0 || len(g.Nodes[b].Deps) != 1 {
		t.Error("Without changed the original or kept the edge")
	}
}

func TestValidateOrder(t *testing.T) {
	g := &Graph{}
	g.Add("a", Compute, nop, 1)
	g.Add("b", D2H, nop)
	if err := g.Validate(); err == nil {
		t.Error("a forward dependency was accepted")
	}
}
