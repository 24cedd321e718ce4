// Package nccltest tests package cuda's NCCL communicator (cuda/nccl.go):
// every collective (AllReduceSum, ReduceScatterSum, AllGather, Broadcast)
// on ragged sizes (0, 1, size-1, size+1, a few thousand and odd, 1 MiB),
// and an all-reduce ordered by events across three streams, bit for bit
// against the sum in rank order computed on the host (comm.SumInRankOrder);
// on one rank in this process (a communicator of one rank), and under
// mpirun, one rank a process (a binary built with the mpi tag).
//
// Built with -tags cudasim (as every CI run does, `make cudasim-nccl-test`)
// it runs on the simulated CUDA runtime and the simulated NCCL
// (kernels/sim/cudart.cpp and nccl.cpp, no GPU): every rank's process has
// its own simulated device 0, and the ranks' sends and receives travel
// between the processes over local sockets, so with -tags "cudasim mpi"
// it runs under `mpirun -np 2` and `-np 3`, with the hazard delays on
// (work not ordered by an event runs out of order), and TestNCCLLostRank
// loses rank 1 of 3 (ncclCommAbort, SIGKILL, or stalled past
// LSP_CUDASIM_NCCL_TIMEOUT) and checks that the others fail with an error
// naming the cause within seconds instead of hanging. What the simulation
// cannot show: NCCL's own behaviour on GPUs (its kernels, NVLink and the
// network, its speed, its reaction to a lost peer, which needs a watchdog
// polling NCCL.Err).
//
// Built with -tags cuda (or "cuda mpi") it runs on real GPUs and
// libnccl.so.2, under mpirun with one rank a GPU on a machine with two
// GPUs or more. Each test skips with a message where libnccl.so.2, a GPU,
// a second GPU or mpirun is missing: none of the GPU runs has happened on
// the machines this was written on.
//
// A cudasim+mpi test binary is built and run by hand with the Makefile's
// SIM_ENV (its source hash rebuilds the C++ when kernels/ changes):
//
//	make cudasim-nccl-test
//	make cudasim-nccl-test RUN=TestNCCLRanks
package nccltest
