package comm

import "fmt"

// Planned is a communicator that only describes a job of Ranks ranks, for
// the planner (train/plan): the engine builds the graph of a data-parallel
// step from its size, and a traced graph runs no host node. Every
// collective returns an error.
type Planned struct{ Ranks int }

func (p Planned) err(op Op) error {
	return fmt.Errorf("comm: %v on a planned communicator of %d ranks: it describes a job and runs nothing", op, p.Ranks)
}

// Rank implements Communicator: the plan is rank 0's.
func (p Planned) Rank() int { return 0 }

// Size implements Communicator.
func (p Planned) Size() int { return p.Ranks }

// AllReduceSum implements Communicator: an error.
func (p Planned) AllReduceSum([]float32) error { return p.err(AllReduce) }

// ReduceScatterSum implements Communicator: an error.
func (p Planned) ReduceScatterSum(_, _ []float32) error { return p.err(ReduceScatter) }

// AllGather implements Communicator: an error.
func (p Planned) AllGather(_, _ []float32) error { return p.err(AllGather) }

// Broadcast implements Communicator: an error.
func (p Planned) Broadcast([]byte, int) error { return p.err(Broadcast) }

// Barrier implements Communicator: an error.
func (p Planned) Barrier() error { return p.err(Barrier) }

// Stats implements Communicator: nothing ran.
func (p Planned) Stats() Stats { return Stats{} }

// Close implements Communicator.
func (p Planned) Close() error { return nil }

var _ Communicator = Planned{}
