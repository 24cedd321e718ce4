// Package mpi is the communicator between processes of the CPU backend:
// comm.Communicator over Open MPI, through cgo (build tag mpi; Debian's
// libopenmpi-dev, found by pkg-config as ompi-c). No maintained Go binding
// of MPI was usable here (the Go module proxy does not serve the ones that
// exist), so this package is its own small cgo layer.
//
// Init is the entry point in every build. Under mpirun (comm.WorldEnv is
// set) a binary built with -tags mpi initialises MPI and returns a *Comm of
// the job's world; one built without the tag returns an error saying so.
// Not under mpirun, both return comm.NewSingle(), world size 1.
//
// # The algorithm
//
// The collectives are point-to-point messages (MPI_Isend, MPI_Irecv), not
// MPI's collectives, for three reasons. The sum must be in rank order
// (comm's package doc), which MPI_Allreduce does not promise; the all-reduce
// is a reduce-scatter (rank j receives shard j of every rank's buffer, sums
// the copies in rank order) followed by an all-gather of the sums, each a
// direct exchange between every pair of ranks. Each message is then known,
// so the bytes counted are the bytes sent. And a wait on messages from named
// peers can give up after a timeout and say which rank it waited for,
// where a blocking collective would hang without a word.
//
// Before its data, each collective exchanges a 24-byte header (sequence
// number, op, size, root) with every peer it talks to; a peer in another
// collective, or with another size, is an error naming both at once
// instead of mixed data or a hang. Messages are cut at 1 GiB (MPI counts
// are C ints); a shard larger than that goes in several rounds.
//
// # A lost rank
//
// When a process of the job dies (killed, crashed, or exited with an
// error), mpirun aborts the job: it ends the other ranks (SIGTERM, then
// SIGKILL a second later: odls_base_sigkill_timeout) and prints which rank
// died and how ("mpirun noticed that process rank 1 with PID ... exited
// on signal 9 (Killed)"), and exits non-zero. So that each surviving rank
// can say so itself within that second, Init gathers every rank's host
// name, pid namespace, pid and process start time; a peer on the same
// host (and namespace) is watched through /proc: while a collective
// waits, every 100 ms, a peer whose process has ended (gone, a zombie, or
// its pid now another process's) makes a collective waiting for it fail
// at once with a *LostError naming it ("lost rank 1: its process ended
// (pid ... on host)"), and Lost, called from a SIGTERM handler, says the
// same outside a collective. Peers on other hosts are not seen; Waiting
// tells such a handler which ranks the collective in progress waits for.
//
// A rank that stops taking part without dying (stuck, stopped, in another
// part of the program) is caught by the communicator itself: a collective
// that sees no progress for Config.Timeout fails with an error naming the
// ranks it still waits for, and the communicator is broken from then on;
// the process should exit non-zero, and mpirun then ends the rest (a rank
// that catches SIGTERM to stop gracefully is still ended: mpirun follows
// with SIGKILL). Open MPI's own signal handlers
// (stack traces on SIGSEGV and others) are switched off before MPI_Init
// (OMPI_MCA_opal_signal empty, unless the environment sets it): the Go
// runtime turns a nil dereference into a panic through its SIGSEGV
// handler, which must stay its own (Open MPI 4.1 already leaves an
// installed handler alone; the setting makes sure of it).
//
// # Threads
//
// All MPI calls run on one goroutine locked to its OS thread, the one that
// called MPI_Init_thread (MPI_THREAD_FUNNELED); the methods of Comm may be
// called from any goroutine and run one at a time.
package mpi

import "time"

// Config configures Init.
type Config struct {
	// Timeout is how long a collective may wait without any of its
	// messages completing before it fails naming the ranks it waits for;
	// 0 is DefaultTimeout. Rank 0 doing work alone (an evaluation, an
	// export) while the others wait in a collective counts against it:
	// raise it for such runs.
	Timeout time.Duration
}

// DefaultTimeout is Config.Timeout's default: long enough for the skew of
// ranks that run the same steps, short enough that a stalled job stops
// with an error within a minute.
const DefaultTimeout = 45 * time.Second
