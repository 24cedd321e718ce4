package kreport

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Markdown renders the report: a few summary lines, then one row per
// kernel, with the figures that differ between architectures written
// "sm_80 / sm_86 / sm_89 / sm_90" and one column of occupancy each.
func Markdown(kernels []*Kernel) string {
	ks := append([]*Kernel(nil), kernels...)
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].File != ks[j].File {
			return ks[i].File < ks[j].File
		}
		return ks[i].Name < ks[j].Name
	})
	var b strings.Builder
	b.WriteString(summary(ks))
	b.WriteString("\n| kernel | file | threads | registers | stack | spills | shared: static + dynamic |")
	for _, a := range Arches {
		fmt.Fprintf(&b, " %s |", a.Name)
	}
	b.WriteString(" HMMA in loops |\n|---|---|--:|--:|--:|--:|--:|")
	for range Arches {
		b.WriteString("--:|")
	}
	b.WriteString("--:|\n")
	for _, k := range ks {
		spills := perArch(k, func(a *ArchInfo) string {
			if a.Spill.Stores+a.Spill.Loads == 0 {
				return "0"
			}
			return fmt.Sprintf("%d st %d ld", a.Spill.Stores, a.Spill.Loads)
		})
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s | %s + %d |", k.Name, k.File,
			perArch(k, func(a *ArchInfo) string { return strconv.Itoa(a.Threads) }),
			perArch(k, func(a *ArchInfo) string { return strconv.Itoa(a.Regs) }),
			perArch(k, func(a *ArchInfo) string { return strconv.Itoa(a.Stack + a.Local) }),
			spills,
			perArch(k, func(a *ArchInfo) string { return strconv.Itoa(a.Shared) }),
			k.DynSmem)
		for _, arch := range Arches {
			if a := k.Arch[arch.Name]; a != nil {
				fmt.Fprintf(&b, " %s |", a.Occ)
			} else {
				b.WriteString(" - |")
			}
		}
		fmt.Fprintf(&b, " %s |\n", perArch(k, func(a *ArchInfo) string {
			if a.SASS == nil {
				return ""
			}
			return strconv.Itoa(a.SASS.HMMAInLoops)
		}))
	}
	return b.String()
}

// perArch writes one figure of every architecture, once when those of the
// architectures the kernel was built for agree ("-" marks the others).
func perArch(k *Kernel, f func(*ArchInfo) string) string {
	var vals []string
	same, first := true, ""
	for _, arch := range Arches {
		a := k.Arch[arch.Name]
		if a == nil {
			vals = append(vals, "-")
			continue
		}
		v := f(a)
		if first == "" {
			first = v
		}
		same = same && v == first
		vals = append(vals, v)
	}
	if same {
		return first
	}
	return strings.Join(vals, " / ")
}

// summary is the report's headline: spills, stack frames, the most
// registers, and where HMMA runs inside loops.
func summary(ks []*Kernel) string {
	var spills, stacks, hmma []string
	maxRegs, maxAt := 0, ""
	files := map[string]bool{}
	for _, k := range ks {
		files[k.File] = true
		var sp, st, hm []string
		allHMMA, sameStack, stack := true, true, -1
		for _, arch := range Arches {
			a := k.Arch[arch.Name]
			if a == nil {
				continue
			}
			if a.Spill.Stores+a.Spill.Loads > 0 {
				sp = append(sp, arch.Name)
			}
			if n := a.Stack + a.Local; n > 0 {
				st = append(st, fmt.Sprintf("%d B on %s", n, arch.Name))
				sameStack = sameStack && (stack < 0 || n == stack)
				stack = n
			}
			if a.SASS == nil || a.SASS.HMMAInLoops == 0 {
				allHMMA = false
			} else {
				hm = append(hm, arch.Name)
			}
			if a.Regs > maxRegs {
				maxRegs, maxAt = a.Regs, k.Name
			}
		}
		if len(sp) > 0 {
			spills = append(spills, fmt.Sprintf("`%s` (%s)", k.Name, strings.Join(sp, ", ")))
		}
		switch {
		case len(st) == len(Arches) && sameStack:
			stacks = append(stacks, fmt.Sprintf("`%s` (%d B on every architecture)", k.Name, stack))
		case len(st) > 0:
			stacks = append(stacks, fmt.Sprintf("`%s` (%s)", k.Name, strings.Join(st, ", ")))
		}
		switch {
		case allHMMA:
			hmma = append(hmma, "`"+k.Name+"`")
		case len(hm) > 0:
			hmma = append(hmma, fmt.Sprintf("`%s` (%s only)", k.Name, strings.Join(hm, ", ")))
		}
	}
	none := func(s []string) string {
		if len(s) == 0 {
			return "none"
		}
		return strings.Join(s, ", ")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "- %d kernels (template instantiations counted apart) in %d files.\n", len(ks), len(files))
	fmt.Fprintf(&b, "- Spills: %s.\n", none(spills))
	fmt.Fprintf(&b, "- Stack frames: %s.\n", none(stacks))
	fmt.Fprintf(&b, "- Most registers: %d (`%s`).\n", maxRegs, maxAt)
	fmt.Fprintf(&b, "- HMMA inside loops on every architecture: %s.\n", none(hmma))
	return b.String()
}
