package hf

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// memConfig is a LLaMA of about 1.14 GB in bf16 (572M parameters): big
// enough that holding the file and the destination at once (2x) cannot
// pass for 1.2x.
var memConfig = llamaConfig{Hidden: 2048, Inter: 5632, Layers: 10, Heads: 32, KVHeads: 4, HeadDim: 64, Vocab: 32000}

const memChildEnv = "LSP_HF_MEMORY_CHILD"

// memValue is element e of tensor t of the generated checkpoint, as bf16
// bits: positive normal numbers (0x3c00..0x3dff), never NaN.
func memValue(t, e int) uint16 { return 0x3c00 + uint16((e*7+t*13)%512) }

// writeMemCheckpoint writes memConfig as bf16 shards of at most 300 MB
// (through WriteStream, a chunk at a time) and their index, and returns
// the weights' byte count.
func writeMemCheckpoint(t *testing.T, dir string) int64 {
	layout := llamaLayout(memConfig)
	const limit = 300 << 20
	var shards [][]int
	var size, total int64
	for i, p := range layout {
		b := int64(p.Len()) * 2
		if len(shards) == 0 || size+b > limit {
			shards = append(shards, nil)
			size = 0
		}
		shards[len(shards)-1] = append(shards[len(shards)-1], i)
		size += b
		total += b
	}
	wm := map[string]string{}
	buf := make([]byte, 1<<20)
	for k, sh := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, len(shards))
		specs := make([]safetensors.Spec, len(sh))
		for j, i := range sh {
			specs[j] = safetensors.Spec{Name: layout[i].Name, DType: safetensors.BF16, Shape: hfShape(layout[i])}
			wm[layout[i].Name] = name
		}
		err := safetensors.WriteStream(filepath.Join(dir, name), specs, map[string]string{"format": "pt"}, func(j int, w io.Writer) error {
			ti, n := sh[j], layout[sh[j]].Len()
			for e0 := 0; e0 < n; e0 += len(buf) / 2 {
				m := min(len(buf)/2, n-e0)
				for e := range m {
					binary.LittleEndian.PutUint16(buf[2*e:], memValue(ti, e0+e))
				}
				if _, err := w.Write(buf[:2*m]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	raw, _ := json.Marshal(map[string]any{"metadata": map[string]int64{"total_size": total}, "weight_map": wm})
	if err := os.WriteFile(filepath.Join(dir, IndexFile), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return total
}

// TestLoadMemory loads a generated sharded bf16 checkpoint of over 1 GB
// into a BF16 tensor of the CPU backend, in a child process (a fresh
// high-water mark), whose peak resident memory (VmHWM) must stay within
// 1.2x the loaded weights' bytes: the shards are mapped and their pages
// handed back tensor by tensor, never all resident beside the destination.
func TestLoadMemory(t *testing.T) {
	if dir := os.Getenv(memChildEnv); dir != "" {
		loadMemChild(t, dir)
		return
	}
	if testing.Short() || raceEnabled {
		t.Skip("writes and loads 1.1 GB; runs in the race-free pass (make gotest-norace)")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc/self/status here")
	}
	dir := t.TempDir()
	total := writeMemCheckpoint(t, dir)
	cmd := exec.Command(os.Args[0], "-test.run=^TestLoadMemory$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), memChildEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var hwm, idle int64 = -1, -1
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "VmHWM-bytes: "); ok {
			hwm, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "VmRSS-idle-bytes: "); ok {
			idle, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if hwm < 0 || idle < 0 {
		t.Fatalf("child reported no VmHWM or idle VmRSS:\n%s", out)
	}
	ratio := float64(hwm) / float64(total)
	t.Logf("loaded %d bytes of bf16 weights with a peak RSS of %d bytes (%.3fx)", total, hwm, ratio)
	if ratio > 1.2 {
		t.Errorf("peak resident memory %d bytes is %.3fx the %d bytes loaded, want at most 1.2x", hwm, ratio, total)
	}
	// What a memory plan counts: the destination, LoadBytes and the
	// staging buffer, above the idle process.
	plan := total + LoadBytes(llamaLayout(memConfig)) + backend.StagingBytes
	t.Logf("above the idle process: %d bytes; planned %d (destination, LoadBytes %d, staging)", hwm-idle, plan, LoadBytes(llamaLayout(memConfig)))
	if used := hwm - idle; used > plan {
		t.Errorf("the load used %d bytes above the idle process, more than the %d planned", used, plan)
	}
}

// loadMemChild is the child's side: load, spot-check values, report VmHWM.
func loadMemChild(t *testing.T, dir string) {
	idle, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(idle), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			fmt.Printf("VmRSS-idle-bytes: %d\n", kb*1024)
		}
	}
	layout := llamaLayout(memConfig)
	be, s := newCPU(t)
	n, _ := layoutLen(layout)
	dst, err := be.Alloc("params", n, backend.BF16)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Load(be, s, dst, layout, LoadOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	// Spot checks: the first and last element of each parameter, and one
	// inside, against the generator (transposed where the layout says).
	for ti, p := range layout {
		for _, e := range []int{0, p.Len() / 3, p.Len() - 1} {
			src := e
			if p.Transposed {
				i, j := e/p.Shape[1], e%p.Shape[1]
				src = j*p.Shape[0] + i
			}
			v, err := backend.Download(be, s, dst.Slice(p.Offset+e, 1))
			if err != nil {
				t.Fatal(err)
			}
			if want := roundBF16(bf16Value(memValue(ti, src))); v[0] != want {
				t.Fatalf("%s[%d] = %g, want %g", p.Name, e, v[0], want)
			}
		}
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Printf("VmHWM-bytes: %d\n", kb*1024)
			return
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
}
