package kreport

import (
	"bufio"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Resources is what a cubin records of one kernel (cuobjdump
// --dump-resource-usage): registers a thread, the stack frame and .local
// bytes a thread, and static shared memory a block, all as built.
type Resources struct {
	Regs, Stack, Local, Shared int
}

// PerArch maps an architecture ("sm_80") to a kernel's mangled name to a value.
type PerArch[T any] map[string]map[string]T

func (p PerArch[T]) set(arch, fn string, v T) {
	if p[arch] == nil {
		p[arch] = map[string]T{}
	}
	p[arch][fn] = v
}

var (
	archLine = regexp.MustCompile(`^arch = (sm_\d+)$`)
	funcLine = regexp.MustCompile(`^\s*Function ([^\s:]+):$`)
	resField = regexp.MustCompile(`\b(REG|STACK|SHARED|LOCAL):(\d+)`)
)

// ParseResourceUsage reads the output of `cuobjdump --dump-resource-usage`
// of one object: every function of every architecture's cubin.
func ParseResourceUsage(text string) (PerArch[Resources], error) {
	out := PerArch[Resources]{}
	arch, fn := "", ""
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := archLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			arch, fn = m[1], ""
			continue
		}
		if m := funcLine.FindStringSubmatch(line); m != nil {
			fn = m[1]
			continue
		}
		if fn == "" || !strings.Contains(line, "REG:") {
			continue
		}
		if arch == "" {
			return nil, fmt.Errorf("resource usage line %d: function %s before any \"arch =\" line", n, fn)
		}
		var r Resources
		seen := 0
		for _, m := range resField.FindAllStringSubmatch(line, -1) {
			v, err := strconv.Atoi(m[2])
			if err != nil {
				return nil, fmt.Errorf("resource usage line %d: %s: %w", n, m[0], err)
			}
			switch m[1] {
			case "REG":
				r.Regs = v
			case "STACK":
				r.Stack = v
			case "SHARED":
				r.Shared = v
			case "LOCAL":
				r.Local = v
			}
			seen++
		}
		if seen != 4 {
			return nil, fmt.Errorf("resource usage line %d: want REG, STACK, SHARED and LOCAL in %q", n, line)
		}
		out.set(arch, fn, r)
		fn = ""
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("resource usage: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("resource usage: no cubin found (an object without device code?)")
	}
	return out, nil
}

var (
	infoSection = regexp.MustCompile(`^\.nv\.info\.(\S+)$`)
	maxThreads  = regexp.MustCompile(`^\s*Value:\s+0x([0-9a-f]+) 0x([0-9a-f]+) 0x([0-9a-f]+)\s*$`)
)

// ParseMaxThreads reads the output of `cuobjdump -elf` of one object: the
// EIATTR_MAX_THREADS of each kernel, the block size its __launch_bounds__
// allows (x*y*z), which is the block every launcher here uses.
func ParseMaxThreads(text string) (PerArch[int], error) {
	out := PerArch[int]{}
	arch, fn, want := "", "", false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch t := strings.TrimSpace(line); {
		case archLine.MatchString(t):
			arch, fn, want = archLine.FindStringSubmatch(t)[1], "", false
		case infoSection.MatchString(line):
			fn, want = infoSection.FindStringSubmatch(line)[1], false
		case strings.HasPrefix(t, "Attribute:"):
			want = strings.HasSuffix(t, "EIATTR_MAX_THREADS")
		case want && strings.HasPrefix(t, "Value:"):
			m := maxThreads.FindStringSubmatch(line)
			if m == nil || fn == "" || arch == "" {
				return nil, fmt.Errorf("elf line %d: cannot read EIATTR_MAX_THREADS from %q", n, line)
			}
			threads := 1
			for _, h := range m[1:] {
				v, err := strconv.ParseInt(h, 16, 32)
				if err != nil {
					return nil, fmt.Errorf("elf line %d: %w", n, err)
				}
				threads *= int(v)
			}
			out.set(arch, fn, threads)
			want = false
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("elf: %w", err)
	}
	return out, nil
}

// Spill is what ptxas -v says of one kernel: the figures it shares with
// the cubin (to check that the code it compiled is the build's) and the
// spills, which only ptxas reports.
type Spill struct {
	Regs, Stack, Stores, Loads int
}

var (
	ptxasProps = regexp.MustCompile(`Function properties for (\S+)$`)
	ptxasFrame = regexp.MustCompile(`^\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
	ptxasEntry = regexp.MustCompile(`Compiling entry function '(\S+)' for '(sm_\d+)'`)
	ptxasUsed  = regexp.MustCompile(`Used (\d+) registers`)
)

// ParsePtxas reads the messages of `ptxas -v` for one architecture: each
// entry function's stack frame, spill stores and loads, and registers.
// Functions that are not entries (ptxas lists the callees it inlined or
// called too) are left out.
func ParsePtxas(text string) (map[string]Spill, error) {
	out := map[string]Spill{}
	entries := map[string]bool{}
	props, entry := "", ""
	frames := map[string]Spill{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := ptxasEntry.FindStringSubmatch(line); m != nil {
			entry = m[1]
			entries[entry] = true
			continue
		}
		if m := ptxasProps.FindStringSubmatch(line); m != nil {
			props = m[1]
			continue
		}
		if m := ptxasFrame.FindStringSubmatch(line); m != nil && props != "" {
			var s Spill
			s.Stack, _ = strconv.Atoi(m[1])
			s.Stores, _ = strconv.Atoi(m[2])
			s.Loads, _ = strconv.Atoi(m[3])
			frames[props] = s
			props = ""
			continue
		}
		if m := ptxasUsed.FindStringSubmatch(line); m != nil && entry != "" {
			s, ok := frames[entry]
			if !ok {
				return nil, fmt.Errorf("ptxas line %d: registers of %s before its properties", n, entry)
			}
			s.Regs, _ = strconv.Atoi(m[1])
			out[entry] = s
			entry = ""
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("ptxas: %w", err)
	}
	for e := range entries {
		if _, ok := out[e]; !ok {
			return nil, fmt.Errorf("ptxas: no registers reported for entry %s", e)
		}
	}
	return out, nil
}

var (
	ptxExternShared = regexp.MustCompile(`^\s*\.extern \.shared .*?(\S+)\[\];`)
	ptxEntry        = regexp.MustCompile(`^\s*(?:\.visible\s+|\.weak\s+)?\.entry (\S+)\(`)
)

// DynamicSmemUsers reads PTX (cuobjdump -ptx) and names the entries that
// touch dynamic shared memory (an .extern .shared array, which is what
// LSP_DYN_SMEM declares): their launchers must say how much they pass.
func DynamicSmemUsers(ptx string) map[string]bool {
	var externs []string
	users := map[string]bool{}
	entry := ""
	for _, line := range strings.Split(ptx, "\n") {
		if m := ptxExternShared.FindStringSubmatch(line); m != nil {
			externs = append(externs, m[1])
			continue
		}
		if m := ptxEntry.FindStringSubmatch(line); m != nil {
			entry = m[1]
			continue
		}
		if entry == "" || users[entry] {
			continue
		}
		for _, e := range externs {
			if strings.Contains(line, e) {
				users[entry] = true
				break
			}
		}
	}
	return users
}
