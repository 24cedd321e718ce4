// The inter-process network of data-parallel training (mpirun): what a
// collective of the engine's graph costs between ranks.

package plan

import "fmt"

// Net is the link between ranks (processes, one GPU each). Bandwidth is
// what one rank sends per second, and receives at the same time (full
// duplex), whatever the number of peers: the rank's NIC or shared-memory
// copy rate is the bottleneck, not the fabric.
type Net struct {
	Name      string
	Bandwidth float64 // bytes/s per rank and direction
	Latency   float64 // s per message
}

// Nets are the network presets, by --net name. Ethernet and InfiniBand
// rates are the line rates (IEEE 802.3 10/25/100 Gb/s; InfiniBand HDR
// 200 Gb/s per port, NDR 400) at 90%, what large MPI messages reach;
// latencies are typical MPI small-message figures for each (kernel TCP
// on Ethernet, RDMA verbs on InfiniBand). shm is two processes on one
// host through Open MPI's shared-memory transport: a copy through host
// memory, taken as 10 GB/s per rank (an assumption, not a measurement).
var Nets = map[string]Net{
	"shm":    {Name: "one host, shared memory", Bandwidth: 10 * gb, Latency: 1e-6},
	"10gbe":  {Name: "10 Gb Ethernet", Bandwidth: 0.9 * 10e9 / 8, Latency: 30e-6},
	"25gbe":  {Name: "25 Gb Ethernet", Bandwidth: 0.9 * 25e9 / 8, Latency: 20e-6},
	"100gbe": {Name: "100 Gb Ethernet", Bandwidth: 0.9 * 100e9 / 8, Latency: 15e-6},
	"ib-hdr": {Name: "InfiniBand HDR 200 Gb/s", Bandwidth: 0.9 * 200e9 / 8, Latency: 2e-6},
	"ib-ndr": {Name: "InfiniBand NDR 400 Gb/s", Bandwidth: 0.9 * 400e9 / 8, Latency: 2e-6},
}

// NetPreset is the network preset of that name.
func NetPreset(name string) (Net, error) {
	n, ok := Nets[name]
	if !ok {
		return Net{}, fmt.Errorf("--net: unknown network %q (want one of %s)", name, names(Nets))
	}
	return n, nil
}

// AllReduceTime is the time of an all-reduce of bytes among ranks as
// train/comm runs it (a reduce-scatter of one shard per rank, then an
// all-gather of the sums): each rank sends and receives (ranks-1)/ranks of
// the buffer in each half, one message per peer. One rank: free.
func (n Net) AllReduceTime(bytes int64, ranks int) float64 {
	if ranks <= 1 || bytes <= 0 {
		return 0
	}
	r := float64(ranks)
	half := (r-1)/r*float64(bytes)/n.Bandwidth + (r-1)*n.Latency
	return 2 * half
}

// AllReduceBytes is about what one rank sends (and receives) in that
// all-reduce: the bytes on the inter-process link (exactly, when the
// element count divides evenly among the ranks).
func AllReduceBytes(bytes int64, ranks int) int64 {
	if ranks <= 1 {
		return 0
	}
	// Each half sends the other ranks' shards of the buffer: bytes less
	// the rank's own shard (Shard gives the ranks nearly equal shares).
	return 2 * (bytes - bytes/int64(ranks))
}
