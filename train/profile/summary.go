package profile

import (
	"math"

	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// Metrics is s as a metrics.jsonl record's profile.
func (s Step) Metrics(mode, backendName, schedule string) *metrics.Profile {
	p := &metrics.Profile{Mode: mode, Backend: backendName, Schedule: schedule, Wall: s.Wall, Engine: s.Engine,
		Check: s.Times.Check, Device: s.Device, Ops: s.Ops, Phases: map[string]float64{}, Families: map[string]float64{},
		FamilyOps: map[string]int{}, Busy: s.Busy, Idle: s.Idle}
	for k, v := range s.Phases {
		p.Phases[string(k)] = v
	}
	for k, v := range s.Families {
		p.Families[string(k)] = v
		p.FamilyOps[string(k)] = s.FamilyOps[k]
	}
	return p
}

// Mean is the step whose every figure is the mean of that figure over
// steps (a figure absent from a step counts as 0 there), so that a
// projector check every few steps shows at its share of each step, and
// the phases and the families still sum to Device.
func Mean(steps []Step) Step {
	m := Step{Phases: map[Phase]float64{}, Families: map[trace.Family]float64{}, FamilyOps: map[trace.Family]int{},
		Busy: map[string]float64{}, Idle: map[string]float64{}}
	n := float64(len(steps))
	if n == 0 {
		return m
	}
	ops := map[trace.Family]float64{}
	var adapterOps float64
	for _, s := range steps {
		m.Wall += s.Wall / n
		m.Engine += s.Engine / n
		m.Times.Check += s.Times.Check / n
		m.Device += s.Device / n
		m.Ops += s.Ops
		m.Adapters += s.Adapters / n
		adapterOps += float64(s.AdapterOps) / n
		for k, v := range s.Phases {
			m.Phases[k] += v / n
		}
		for k, v := range s.Families {
			m.Families[k] += v / n
			ops[k] += float64(s.FamilyOps[k]) / n
		}
		for k, v := range s.Busy {
			m.Busy[k] += v / n
			m.Idle[k] += s.Idle[k] / n
		}
	}
	m.Ops = int(math.Round(float64(m.Ops) / n))
	m.AdapterOps = int(math.Round(adapterOps))
	for k, v := range ops {
		m.FamilyOps[k] = int(math.Round(v))
	}
	return m
}
