// Tests of full disks and of the output directory: a write that finds
// the disk full, at each point of each output (checkpoint, metrics,
// export, plot), ends the run with an error naming the file, keeps the
// previous checkpoint and export, leaves no partial or temp file, and a
// resume after space is freed ends as an uninterrupted run; the same on a
// real full tmpfs where the test may mount one; an existing --out is
// refused unless resumed or overwritten.
//
// Limits: the injected disk-full errors come from train/faults at the
// points the code passes (a real ENOSPC can also come from close or from
// the directory fsync, which the same error paths handle); the tmpfs
// test needs root and mount(2), and skips without them.

package train

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/faults"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/metrics"
)

// copyDir copies the regular files and directories of src into dst.
func copyDir(t *testing.T, dst, src string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() {
			copyDir(t, filepath.Join(dst, e.Name()), filepath.Join(src, e.Name()))
			continue
		}
		copyFile(t, filepath.Join(dst, e.Name()), filepath.Join(src, e.Name()))
	}
}

// noLeftovers fails if dir holds a temp file or directory of a write.
func noLeftovers(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("%s left behind in %s", e.Name(), dir)
		}
	}
}

// fileBytes reads path, or returns nil when it does not exist.
func fileBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDiskFull fills the disk at each write point of each output.
func TestDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("two dozen runs, slow under -race; runs in make test's race-free pass (gotest-norace)")
	}
	base := quickConfig(t, writeModel(t, microConfig(16, 1)))
	base.CheckpointEvery = 2
	ref := base
	ref.Out = filepath.Join(t.TempDir(), "ref")
	mustRun(t, context.Background(), ref, Options{})

	stopped := filepath.Join(t.TempDir(), "stopped") // a checkpoint at step 2
	c := base
	c.Out = stopped
	mustRun(t, context.Background(), c, Options{StopAfter: 2})
	finished := filepath.Join(t.TempDir(), "finished") // a whole run: its export too
	copyDir(t, finished, ref.Out)

	for _, tc := range []struct {
		spec string // where the disk fills
		from string // the output directory the run resumes
		file string // the file the error must name
	}{
		{"temp-partial@" + checkpoint.FileName, stopped, checkpoint.FileName},
		{"temp-written@" + checkpoint.FileName, stopped, checkpoint.FileName},
		{"temp-fsynced@" + checkpoint.FileName, stopped, checkpoint.FileName},
		{"temp-partial@metrics.jsonl", stopped, "metrics.jsonl"}, // the rewrite on resume
		{"metrics-partial@metrics.jsonl", stopped, "metrics.jsonl"},
		{"metrics-partial@metrics.jsonl:3", stopped, "metrics.jsonl"}, // step 4's eval record
		{"temp-partial@model.safetensors", stopped, "hf"},
		{"temp-written@config.json", stopped, "hf"},
		{"dir-written@hf", stopped, "hf"},
		{"dir-written@hf", finished, "hf"}, // the earlier export must stay
		{"temp-partial@loss.png", stopped, "loss.png"},
		{"temp-fsynced@loss.png", finished, "loss.png"},
	} {
		t.Run(tc.spec+" from "+filepath.Base(tc.from), func(t *testing.T) {
			c := base
			c.Out = filepath.Join(t.TempDir(), "out")
			copyDir(t, c.Out, tc.from)
			c.Resume = true
			ck := filepath.Join(c.Out, checkpoint.FileName)
			oldCk, oldHF := fileBytes(t, ck), fileBytes(t, filepath.Join(c.Out, "hf", "model.safetensors"))
			disarm, err := faults.Arm(faults.Fail, tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Run(context.Background(), c, Options{})
			disarm()
			if err == nil {
				t.Fatalf("the disk filled at %s, yet the run succeeded", tc.spec)
			}
			if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), filepath.Join(c.Out, tc.file)) ||
				!strings.Contains(err.Error(), "--resume") {
				t.Errorf("error %q: want ENOSPC, the file %s and what to do (--resume)", err, filepath.Join(c.Out, tc.file))
			}
			noLeftovers(t, c.Out)
			noLeftovers(t, filepath.Join(c.Out, "hf"))
			// The checkpoint is the one before or a complete newer one.
			got := fileBytes(t, ck)
			if _, lerr := checkpoint.Load(ck, microConfig(16, 1), nil); lerr != nil {
				t.Errorf("the checkpoint does not load after a full disk: %v", lerr)
			}
			if tc.file == checkpoint.FileName && string(got) != string(oldCk) {
				t.Errorf("the checkpoint write failed, yet %s changed", ck)
			}
			if hf := fileBytes(t, filepath.Join(c.Out, "hf", "model.safetensors")); tc.file == "hf" && string(hf) != string(oldHF) {
				t.Errorf("the export failed, yet hf/ changed (was %d bytes, now %d)", len(oldHF), len(hf))
			}
			raw := fileBytes(t, filepath.Join(c.Out, "metrics.jsonl"))
			if len(raw) > 0 && raw[len(raw)-1] != '\n' {
				t.Errorf("metrics.jsonl ends in a partial line: %q", raw[max(0, len(raw)-40):])
			}
			if _, err := metrics.ReadFile(filepath.Join(c.Out, "metrics.jsonl")); err != nil {
				t.Error(err)
			}
			// Space is back: the resumed run ends as the uninterrupted one.
			mustRun(t, context.Background(), c, Options{})
			sameTensors(t, readCheckpoint(t, ref.Out), readCheckpoint(t, c.Out))
			if _, _, err := gpt2.LoadHF(filepath.Join(c.Out, "hf")); err != nil {
				t.Error(err)
			}
			noLeftovers(t, c.Out)
		})
	}
}

// mountTmpfs mounts a tmpfs of size bytes on a new directory, or skips.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s); the injected disk-full test covers the same paths", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes a file in dir until the disk is full, then frees keep
// bytes of it.
func fill(t *testing.T, dir string, keep int64) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	var n int64
	for {
		m, err := f.Write(buf)
		n += int64(m)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(max(0, n-keep)); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestDiskFullTmpfs runs on a real, small tmpfs: a disk too full for the
// next checkpoint but not for the metrics, then one full to the last
// byte, then freed.
func TestDiskFullTmpfs(t *testing.T) {
	if testing.Short() {
		t.Skip("mounts a tmpfs; runs in make test's race-free pass (gotest-norace)")
	}
	mnt := mountTmpfs(t, "4m")
	c := quickConfig(t, writeModel(t, microConfig(16, 1)))
	c.CheckpointEvery = 2
	ref := c
	mustRun(t, context.Background(), ref, Options{})

	c.Out = filepath.Join(mnt, "out")
	mustRun(t, context.Background(), c, Options{StopAfter: 2})
	ck := filepath.Join(c.Out, checkpoint.FileName)
	old := fileBytes(t, ck)
	c.Resume = true
	for _, tc := range []struct {
		name string
		free int64
	}{
		{"room for the metrics, not the checkpoint", int64(len(old)) / 2},
		{"no room at all", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			filler := fill(t, mnt, tc.free)
			_, err := Run(context.Background(), c, Options{})
			if err == nil || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), c.Out) {
				t.Fatalf("error %v: want ENOSPC naming a file in %s", err, c.Out)
			}
			if tc.free > 0 && !strings.Contains(err.Error(), ck) {
				t.Errorf("error %v: want it to name %s", err, ck)
			}
			noLeftovers(t, c.Out)
			if got := fileBytes(t, ck); string(got) != string(old) {
				t.Errorf("%s changed after the failed write", ck)
			}
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
		})
	}
	mustRun(t, context.Background(), c, Options{})
	sameTensors(t, readCheckpoint(t, ref.Out), readCheckpoint(t, c.Out))
	noLeftovers(t, c.Out)
}

// TestOutDirectory: a non-empty --out is refused without --resume or
// --overwrite, naming the directory and both flags; --overwrite removes
// the earlier run's outputs and nothing else; both flags together are
// refused.
func TestOutDirectory(t *testing.T) {
	c := quickConfig(t, writeModel(t, microConfig(16, 1)))
	c.Steps = 2
	mustRun(t, context.Background(), c, Options{})
	mine := filepath.Join(c.Out, "notes.txt")
	writeFile(t, mine, "the user's own file")
	ck := fileBytes(t, filepath.Join(c.Out, checkpoint.FileName))
	plot := fileBytes(t, filepath.Join(c.Out, "loss.png"))

	_, err := Run(context.Background(), c, Options{})
	wantErr(t, err, "--out", c.Out, "--resume", "--overwrite")
	if got := fileBytes(t, filepath.Join(c.Out, checkpoint.FileName)); string(got) != string(ck) {
		t.Error("a refused run changed the checkpoint")
	}

	both := c
	both.Resume, both.Overwrite = true, true
	_, err = Run(context.Background(), both, Options{})
	wantErr(t, err, "--overwrite", "--resume")

	// --overwrite: a run killed before its first checkpoint must not leave
	// the earlier run's checkpoint to resume, so the outputs go at start.
	c.Overwrite = true
	res, err := Run(context.Background(), c, Options{StopAfter: 1})
	if err != nil || !res.Interrupted {
		t.Fatalf("overwrite run: %v", err)
	}
	if _, err := os.Stat(filepath.Join(c.Out, "hf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("--overwrite kept the earlier run's hf")
	}
	// The interrupted run draws its own plot, of its one step.
	if got := fileBytes(t, filepath.Join(c.Out, "loss.png")); got == nil || bytes.Equal(got, plot) {
		t.Errorf("--overwrite kept the earlier run's loss.png, or the new run drew none")
	}
	if fileBytes(t, mine) == nil {
		t.Error("--overwrite removed a file that is not a run output")
	}
	recs, err := metrics.ReadFile(filepath.Join(c.Out, "metrics.jsonl"))
	if err != nil || len(recs) != 1 || recs[0].Step != 1 {
		t.Errorf("metrics after --overwrite: %v %v, want only step 1", recs, err)
	}
}
