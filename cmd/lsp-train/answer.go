// The plan's answer: per mode, the command line that fits the machine
// and trains fastest at the global batch asked for, or what would have to
// change when nothing does.
//
// Limits: the search keeps the global batch (--batch x --grad-accum) and
// the sequence length, and varies the micro-batch (halving it, the
// micro-batches growing to match) and --recompute; in lsp and lora modes,
// when nothing fits as asked, --dense-params (frozen, then host), and in
// lsp mode then --d (halved twice), which change what training does, so
// it is said. The dtypes, and lora's rank and targets, stay as given.

package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/plan"
)

// candidate is one command line the answer tried, with its plan.
type candidate struct {
	o      planOptions // batch, accum and d as tried
	rc     model.Recompute
	report plan.Report
}

// answer is one mode's: the fastest candidate that fits (nil when none
// does) and, for the message when none does, the least device memory
// and host peak any candidate needed.
type answer struct {
	mode                 engine.Mode
	asked                planOptions // the flags asked for, --dense-params resolved
	best                 *candidate
	minDevice, minHost   int64
	minDeviceAt          string // the flags of the least device memory
	deviceFits, hostFits bool   // some candidate fits the device (the host)
}

// answerMode searches mode's command lines (see the file's comment).
func (o planOptions) answerMode(j planJob, mode engine.Mode, m plan.Machine) (answer, error) {
	if o.dense == "" {
		// As training resolves it: frozen from a checkpoint, device for a
		// preset.
		o.dense = string(o.engineConfig(j, engine.LSP).DenseParams)
	}
	if o.d == 0 {
		// As training resolves --d 0 (lsp.AutoD), the largest any matrix
		// gets, so that the command lines name it and halving it means
		// something.
		for _, mt := range j.spec.Matrices() {
			o.d = max(o.d, lsp.AutoD(mt.M, mt.N))
		}
	}
	a := answer{mode: mode, asked: o, minDevice: -1, minHost: -1}
	budget := m.GPU.Budget()
	global := o.batch * o.accum
	// The variants of what lsp trains, in order: as asked, the dense
	// parameters elsewhere, then smaller subspaces; each tried only when
	// none before it fits.
	type variant struct {
		dense string
		d     int
	}
	variants := []variant{{o.dense, o.d}}
	if mode.FrozenMatrices() {
		for _, dense := range []string{string(engine.DenseFrozen), string(engine.DenseHost)} {
			// galore's optimizer is on the device: no host variant.
			if dense != o.dense && (mode != engine.Galore || dense != string(engine.DenseHost)) {
				variants = append(variants, variant{dense, o.d})
			}
		}
		for _, d := range []int{o.d / 2, o.d / 4} {
			if d >= 1 && mode == engine.LSP {
				variants = append(variants, variant{o.dense, d}, variant{string(engine.DenseFrozen), d})
			}
		}
	}
	for _, v := range variants {
		if a.best != nil {
			break
		}
		for b := o.batch; b >= 1; b /= 2 {
			if global%b != 0 {
				continue
			}
			oc := o
			oc.batch, oc.accum, oc.dense, oc.d = b, global/b, v.dense, v.d
			tc := oc.trainConfig(j, mode)
			mems, residencies, err := recomputePlans(j.spec, tc, m.Ranks, budget)
			if err != nil {
				return a, err
			}
			for _, rc := range model.Recomputes {
				mem := mems[rc]
				if a.minDevice < 0 || mem.DeviceTotal() < a.minDevice {
					a.minDevice = mem.DeviceTotal()
					a.minDeviceAt = fmt.Sprintf("--batch %d --recompute %v", b, rc)
					if mode.FrozenMatrices() {
						a.minDeviceAt += " --dense-params " + v.dense
					}
					if mode == engine.LSP {
						a.minDeviceAt += fmt.Sprintf(" --d %d", v.d)
					}
				}
				if a.minHost < 0 || mem.HostPeak() < a.minHost {
					a.minHost = mem.HostPeak()
				}
				dev, host := mem.DeviceTotal() <= budget, mem.HostPeak() <= m.Host.Memory
				a.deviceFits, a.hostFits = a.deviceFits || dev, a.hostFits || host
				if !dev || !host {
					continue
				}
				tc.Recompute, tc.GradResidency = rc, residencies[rc]
				c := plan.Config{Arch: j.spec, B: b, T: o.seqLen, Accum: oc.accum, DType: j.dt, Engine: train.EngineConfig(tc), Memory: &mem,
					DeviceCollectives: tc.Collectives != train.CollectivesHost}
				r, err := plan.Plan(c, m)
				if err != nil {
					return a, err
				}
				if a.best == nil || r.TokensPerSec > a.best.report.TokensPerSec {
					a.best = &candidate{o: oc, rc: rc, report: r}
				}
				break // more recomputation only costs time at this micro-batch
			}
		}
	}
	return a, nil
}

// command is the lsp-train command line of a candidate.
func (c candidate) command(mode engine.Mode) string {
	o := c.o
	args := []string{"lsp-train", "--model", o.model, "--mode", string(mode), "--batch", fmt.Sprint(o.batch),
		"--grad-accum", fmt.Sprint(o.accum), "--seq-len", fmt.Sprint(o.seqLen), "--recompute", c.rc.String(), "--dtype", o.dtype}
	if mode.FrozenMatrices() {
		args = append(args, "--dense-params", o.dense)
	}
	switch {
	case mode == engine.LSP:
		args = append(args, "--d", fmt.Sprint(o.d))
		if o.projector != "" && o.projector != lsp.KindSparse {
			args = append(args, "--projector", string(o.projector)) // the kind planned for
		}
	case mode == engine.Galore:
		args = append(args, "--galore-rank", fmt.Sprint(o.galoreRank))
	case mode == engine.LoRA:
		args = append(args, "--lora-r", fmt.Sprint(o.loraR))
		if o.loraTargets != "" {
			args = append(args, "--lora-targets", o.loraTargets)
		}
		if o.baseDType != "" {
			args = append(args, "--base-dtype", o.baseDType)
		}
	}
	return strings.Join(args, " ")
}

// line is the candidate's command line and, below it, what it needs and
// how fast it goes, and where it departs from what o asked for beyond
// the micro-batch and recomputation (which change nothing of the result).
func (c candidate) line(mode engine.Mode, o planOptions) string {
	r := c.report
	note := ""
	if c.o.dense != o.dense {
		note += fmt.Sprintf("; --dense-params %s, not %s: a different run", c.o.dense, o.dense)
	}
	if c.o.d != o.d {
		note += fmt.Sprintf("; --d %d, not %d: a smaller subspace, a different run", c.o.d, o.d)
	}
	return fmt.Sprintf("%s\n      (device %s, host %s, %.0f tokens/s%s)", c.command(mode),
		gibs(r.Memory.DeviceTotal()), gibs(r.Memory.HostPeak()), r.TokensPerSec, note)
}

// printAnswers writes each mode's answer, then the fastest mode that fits.
func printAnswers(w io.Writer, o planOptions, answers []answer, m plan.Machine) {
	fmt.Fprintf(w, "answer (the global batch kept: %d x %d tokens per step; on %s, %s usable):\n", o.batch*o.accum, o.seqLen, m.GPU.Name, gibs(m.GPU.Budget()))
	var fastest *answer
	for i, a := range answers {
		if a.best == nil {
			fmt.Fprintf(w, "  %s: nothing fits: %s\n", a.mode, a.why(m, answers))
			continue
		}
		fmt.Fprintf(w, "  %s: %s\n", a.mode, a.best.line(a.mode, a.asked))
		if r := a.best.report; fastest == nil || r.TokensPerSec > fastest.best.report.TokensPerSec {
			fastest = &answers[i]
		}
	}
	if fastest != nil {
		fmt.Fprintf(w, "fastest that fits: %s\n", fastest.mode)
	} else {
		fmt.Fprintf(w, "nothing fits in any mode: a smaller model, a shorter --seq-len, or more memory (above)\n")
	}
}

// why says what would have to change for a mode that fits nowhere: the
// device memory it needs at least (and the smallest preset card that has
// it), or the host memory, and which modes fit instead.
func (a answer) why(m plan.Machine, all []answer) string {
	var parts []string
	if !a.deviceFits {
		s := fmt.Sprintf("it needs at least %s of device memory (%s), the card has %s usable",
			gibs(a.minDevice), a.minDeviceAt, gibs(m.GPU.Budget()))
		if card := smallestCard(a.minDevice); card != "" {
			s += "; the smallest preset card with enough is " + card
		}
		parts = append(parts, s)
	}
	if !a.hostFits {
		parts = append(parts, fmt.Sprintf("it needs at least %s of host memory, the host has %s", gibs(a.minHost), gibs(m.Host.Memory)))
	}
	if a.deviceFits && a.hostFits {
		parts = append(parts, "no command line fits the device and the host at once")
	}
	var others []string
	for _, b := range all {
		if b.best != nil {
			others = append(others, string(b.mode))
		}
	}
	if len(others) > 0 {
		parts = append(parts, "use --mode "+strings.Join(others, " or "))
	} else {
		parts = append(parts, "or a smaller model")
	}
	return strings.Join(parts, "; ")
}

// smallestCard is the preset GPU with the least memory whose budget holds
// need bytes ("" for none).
func smallestCard(need int64) string {
	var names []string
	for name := range plan.GPUs {
		names = append(names, name)
	}
	slices.SortFunc(names, func(x, y string) int {
		if c := cmp.Compare(plan.GPUs[x].Memory, plan.GPUs[y].Memory); c != 0 {
			return c
		}
		return strings.Compare(x, y)
	})
	for _, name := range names {
		m, err := plan.Preset(name, "", "")
		if err == nil && m.GPU.Budget() >= need {
			return name
		}
	}
	return ""
}

// printWhatFits is plan --gpu X without --model: per mode, the largest
// preset model that fits the machine at the global batch of the flags,
// with its command line (the answer's search), and the presets tried.
func (o planOptions) printWhatFits(w io.Writer, j planJob) error {
	m := j.machine
	type preset struct {
		name string
		spec model.Spec
	}
	var presets []preset
	for _, name := range catalog.Presets() {
		spec, _, err := catalog.Resolve(name)
		if err != nil {
			return err
		}
		presets = append(presets, preset{name, spec})
	}
	slices.SortStableFunc(presets, func(a, b preset) int { return cmp.Compare(a.spec.NumParams(), b.spec.NumParams()) })
	fmt.Fprintf(w, "what fits on %s (%s usable; host %s), at %d x %d tokens per step (--batch x --grad-accum, --seq-len; micro-batch and --recompute chosen per mode), %s:\n",
		m.GPU.Name, gibs(m.GPU.Budget()), gibs(m.Host.Memory), o.batch*o.accum, o.seqLen, o.dtype)
	for _, mode := range j.modes {
		var best *answer
		var bestName string
		for _, p := range presets {
			op := o
			op.model = p.name
			jp, err := op.parse()
			if err != nil {
				continue // a preset whose context is shorter than --seq-len
			}
			jp.machine = m
			a, err := op.answerMode(jp, mode, m)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", p.name, mode, err)
			}
			if a.best != nil {
				best, bestName = &a, fmt.Sprintf("%s (%.3gB parameters)", p.name, float64(p.spec.NumParams())/1e9)
			}
		}
		if best == nil {
			fmt.Fprintf(w, "  %s: no preset model fits\n", mode)
			continue
		}
		fmt.Fprintf(w, "  %s: at most %s: %s\n", mode, bestName, best.best.line(mode, best.asked))
	}
	fmt.Fprintf(w, "(the presets: %s; --model names one, or a checkpoint directory, for the whole plan)\n", strings.Join(catalog.Presets(), ", "))
	return nil
}
