// Kept checkpoints and step exports (--keep-checkpoints, --export-every):
// what HF Trainer's save_total_limit and a periodic export give, without a
// second write of the checkpoint. Each save leaves the latest in
// <out>/checkpoint.safetensors, as it always did, and with
// --keep-checkpoints N > 1 also a step-numbered name for the same file
// in <out>/checkpoints/ (a hard link: no extra write, one file's disk per
// kept step; a copy where the file system has no hard links), the N
// written last kept. --export-every N exports the weights every N steps
// into <out>/hf-step-NNNNNN/ the way the final export writes hf/.
//
// Limits: --resume reads <out>/checkpoint.safetensors only; to go back to
// a kept step, replace that name by it (ln -f, not cp: cp would write
// into the file the newest step's name shares). Neither adds to the memory
// plan: the link holds nothing, the copy a 1 MiB buffer
// (atomicfile.BufferBytes), and a step export is the plan's "export"
// transient, in its own phase like the final one.

package train

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
)

// keptDir is the directory of the step-numbered checkpoints in out.
func keptDir(out string) string { return filepath.Join(out, "checkpoints") }

// keptName is the name of step's kept checkpoint.
func keptName(step int) string {
	return fmt.Sprintf("step-%06d%s", step, filepath.Ext(checkpoint.FileName))
}

// stepExportDir is the directory of step's Hugging Face export in out.
func stepExportDir(out string, step int) string {
	return filepath.Join(out, fmt.Sprintf("hf-step-%06d", step))
}

// keepCheckpoint gives the checkpoint just written a step-numbered name in
// <out>/checkpoints/ and removes the kept ones beyond --keep-checkpoints;
// nothing with --keep-checkpoints 1. Rank 0 only, after the write.
func (r *run) keepCheckpoint() error {
	if r.cfg.KeepCheckpoints <= 1 {
		return nil
	}
	dir := keptDir(r.cfg.Out)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return diskHint(fmt.Errorf("--keep-checkpoints: %w", err))
	}
	dst := filepath.Join(dir, keptName(r.step))
	if err := linkOrCopy(r.checkpointPath(), dst); err != nil {
		return diskHint(fmt.Errorf("step %d: --keep-checkpoints: %w", r.step, err))
	}
	removed, err := pruneKept(dir, r.cfg.KeepCheckpoints)
	if len(removed) > 0 {
		r.log.Info("removed checkpoints beyond --keep-checkpoints", "keep", r.cfg.KeepCheckpoints, "removed", removed)
	}
	if err != nil {
		return fmt.Errorf("step %d: --keep-checkpoints: %w", r.step, err)
	}
	return nil
}

// linkOrCopy makes dst the same file as src: a hard link made under a temp
// name and renamed over dst (so that a kill leaves dst whole, old or new,
// and atomicfile.Clean the temp), or where the file system cannot link, an
// atomic copy.
func linkOrCopy(src, dst string) error {
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-link")
	os.Remove(tmp) // a killed run's
	err := os.Link(src, tmp)
	if err == nil {
		if err = os.Rename(tmp, dst); err != nil {
			os.Remove(tmp)
		}
		return err
	}
	if !errors.Is(err, syscall.EXDEV) && !errors.Is(err, syscall.EPERM) && !errors.Is(err, syscall.ENOTSUP) &&
		!errors.Is(err, syscall.EMLINK) && !errors.Is(err, errors.ErrUnsupported) {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return atomicfile.WriteFile(dst, 0o644, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	})
}

// keptFile is one kept checkpoint.
type keptFile struct {
	name string
	step int
	mod  time.Time
}

// pruneKept removes the kept checkpoints in dir beyond the keep written
// last, and returns their names. Last written, not highest step: after a
// rewind (an older one put back as the latest) the steps of the abandoned
// continuation are the ones to go first.
func pruneKept(dir string, keep int) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var kept []keptFile
	for _, e := range ents {
		num, ok := strings.CutPrefix(strings.TrimSuffix(e.Name(), filepath.Ext(checkpoint.FileName)), "step-")
		step, err := strconv.Atoi(num)
		if !ok || err != nil || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, err
		}
		kept = append(kept, keptFile{e.Name(), step, info.ModTime()})
	}
	// Newest first; steps break ties of the clock's granularity.
	slices.SortFunc(kept, func(a, b keptFile) int {
		if c := b.mod.Compare(a.mod); c != 0 {
			return c
		}
		return b.step - a.step
	})
	var removed []string
	for _, k := range kept[min(keep, len(kept)):] {
		if err := os.Remove(filepath.Join(dir, k.name)); err != nil {
			return removed, err
		}
		removed = append(removed, k.name)
	}
	return removed, nil
}

// exportStep writes the weights of the step just taken as a Hugging Face
// directory, <out>/hf-step-NNNNNN/, through the final export's path
// (exportTo). Rank 0 only.
func (r *run) exportStep() error {
	t0 := time.Now()
	defer func() { r.times.Export += time.Since(t0) }()
	dir := stepExportDir(r.cfg.Out, r.step)
	if err := r.exportTo(dir); err != nil {
		return fmt.Errorf("step %d: --export-every: %w", r.step, err)
	}
	r.report.logf("exported", "step", r.step, "dir", dir)
	return nil
}

// exportTo writes the weights as a Hugging Face directory at dir:
// straight from the device, a chunk at a time through the staging buffer
// (catalog.ExportBytes on the host, not the model), as a whole directory,
// with the files of the tokenizer the run trained with (those of src, the
// directory --model named, when it came from there).
func (r *run) exportTo(dir string) error {
	defer releaseHost() // the writer's buffers
	end := phase("export")
	var err error
	if r.usesAdapters() {
		err = r.exportAdapters(dir)
	} else {
		err = catalog.ExportFrom(r.mc, dir, r.fetchParams, r.src, r.tok)
	}
	end()
	return diskHint(err)
}
