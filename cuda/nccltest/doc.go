// Package nccltest tests package cuda's NCCL communicator on real GPUs: on
// one GPU in this process (a communicator of one rank), and, on a machine
// with two GPUs or more, under mpirun with one rank a GPU (a binary built
// with -tags "cuda mpi"), every collective bit for bit against the sum in
// rank order computed on the host. Each test skips with a message where
// libnccl.so.2, a GPU, a second GPU or mpirun is missing, as on every CI
// machine: none of this has run on the machines this was written on.
package nccltest
