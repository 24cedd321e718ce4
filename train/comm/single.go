package comm

import (
	"errors"
	"fmt"
	"sync"
)

// Single is the communicator of a process that runs alone (world size 1,
// rank 0): what a run not launched by mpirun gets. Its collectives move no
// bytes: the all-reduce and the broadcast leave the buffer as it is, the
// reduce-scatter and the all-gather copy (a sum over one rank is that
// rank's value). It checks its arguments as a real communicator does, so a
// caller's mistake shows in a one-process run too.
type Single struct {
	mu     sync.Mutex
	stats  Stats
	closed bool
}

// NewSingle returns a communicator of one rank.
func NewSingle() *Single { return &Single{} }

var errClosed = errors.New("comm: communicator is closed")

// Rank implements Communicator: always 0.
func (s *Single) Rank() int { return 0 }

// Size implements Communicator: always 1.
func (s *Single) Size() int { return 1 }

func (s *Single) call(op Op, n, shard, root int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%v: %w", op, errClosed)
	}
	if err := CheckArgs(op, 1, 0, n, shard, root); err != nil {
		return err
	}
	s.stats.Ops[op].Calls++
	return nil
}

// AllReduceSum implements Communicator: x is already the sum.
func (s *Single) AllReduceSum(x []float32) error { return s.call(AllReduce, len(x), 0, 0) }

// ReduceScatterSum implements Communicator: shard = x.
func (s *Single) ReduceScatterSum(shard, x []float32) error {
	if Overlap(shard, x) {
		return fmt.Errorf("comm: %v: shard overlaps x", ReduceScatter)
	}
	if err := s.call(ReduceScatter, len(x), len(shard), 0); err != nil {
		return err
	}
	copy(shard, x)
	return nil
}

// AllGather implements Communicator: x = shard.
func (s *Single) AllGather(x, shard []float32) error {
	if err := s.call(AllGather, len(x), len(shard), 0); err != nil {
		return err
	}
	copy(x, shard) // copy handles shard == x
	return nil
}

// Broadcast implements Communicator: root must be 0; b is unchanged.
func (s *Single) Broadcast(b []byte, root int) error { return s.call(Broadcast, len(b), 0, root) }

// Barrier implements Communicator.
func (s *Single) Barrier() error { return s.call(Barrier, 0, 0, 0) }

// Stats implements Communicator: calls, and no bytes.
func (s *Single) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Close implements Communicator.
func (s *Single) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
