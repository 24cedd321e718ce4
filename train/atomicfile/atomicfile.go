// Package atomicfile writes files so that a reader (or a crash) sees either
// the old content or the complete new content, never a partial file.
//
// Limits: atomicity relies on rename(2) within one directory, which POSIX file
// systems provide; on network file systems or Windows the guarantees are
// weaker. The new file gets exactly perm (set with chmod, so the umask does not
// apply), not the old file's mode. A process killed mid-write leaves its temp
// file (named .NAME.tmp-*) behind; Clean removes such leftovers.
//
// Every write passes the named points of train/faults (temp-partial,
// temp-written, temp-fsynced, renamed, dir-fsynced), where tests inject a
// kill or a full disk; unarmed, they cost nothing.
package atomicfile

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/lsp-offload/lsp-offload/train/faults"
)

// BufferBytes is the write buffer WriteFile and WritePatched hold while
// fn runs (a memory plan of a writer counts it).
const BufferBytes = 1 << 20

// WriteFile writes path atomically: it creates a temp file in the same
// directory, writes it via fn (through a buffer), fsyncs and closes it, renames
// it over path and fsyncs the directory so the rename itself is durable.
// On any error the temp file is removed and the existing file at path is
// untouched.
func WriteFile(path string, perm os.FileMode, fn func(w io.Writer) error) error {
	return WritePatched(path, perm, func(w io.Writer, _ Patch) error { return fn(w) })
}

// splitTarget is the directory a temp for path goes in (".", for a bare
// name) and the base name the temp's name is made from.
func splitTarget(path string) (dir, base string) {
	dir, base = filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	return dir, base
}

// Patch overwrites bytes the write has already passed, at offset off of
// the file: for a header whose content is known only once the rest is
// written (a checkpoint's checksums), written first as a placeholder of
// the same length.
type Patch func(off int64, b []byte) error

// WritePatched is WriteFile whose fn may also patch what it has written.
func WritePatched(path string, perm os.FileMode, fn func(w io.Writer, patch Patch) error) (err error) {
	dir, base := splitTarget(path)
	// Same directory as the target: rename across file systems is not atomic.
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("atomicfile: create temp for %s: %w", path, err)
	}
	tmpName := tmp.Name()
	closed := false
	defer func() {
		if err != nil {
			if !closed {
				tmp.Close()
			}
			os.Remove(tmpName)
		}
	}()

	var out io.Writer = tmp
	if faults.Armed() {
		out = &partialPoint{w: tmp, file: base}
	}
	bw := bufio.NewWriterSize(out, BufferBytes)
	patch := func(off int64, b []byte) error {
		if err := bw.Flush(); err != nil {
			return err
		}
		_, err := tmp.WriteAt(b, off)
		return err
	}
	if err = fn(bw, patch); err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", path, err)
	}
	if err = bw.Flush(); err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", path, err)
	}
	if err = faults.Point("temp-written", base); err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", path, err)
	}
	// CreateTemp uses 0600; set the requested mode before the file becomes visible.
	if err = tmp.Chmod(perm); err != nil {
		return fmt.Errorf("atomicfile: write %s: chmod %s: %w", path, tmpName, err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("atomicfile: write %s: fsync %s: %w", path, tmpName, err)
	}
	closed = true
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("atomicfile: write %s: close %s: %w", path, tmpName, err)
	}
	if err = faults.Point("temp-fsynced", base); err != nil {
		return fmt.Errorf("atomicfile: write %s: fsync %s: %w", path, tmpName, err)
	}
	if err = os.Rename(tmpName, path); err != nil {
		return fmt.Errorf("atomicfile: rename %s to %s: %w", tmpName, path, err)
	}
	// After the rename the new content is in place (the temp name is gone,
	// so nothing is left to remove); a failing directory fsync only weakens
	// durability, but it is still reported.
	if perr := faults.Point("renamed", base); perr != nil {
		return fmt.Errorf("atomicfile: fsync directory of %s: %w", path, perr)
	}
	if serr := syncDir(dir); serr != nil {
		return fmt.Errorf("atomicfile: fsync directory of %s: %w", path, serr)
	}
	if perr := faults.Point("dir-fsynced", base); perr != nil {
		return fmt.Errorf("atomicfile: after writing %s: %w", path, perr)
	}
	return nil
}

// partialPoint passes the temp-partial fault point once, after the first
// half of the first write reached the file, so that a kill there leaves a
// partly written temp file. It is used only while a fault is armed.
type partialPoint struct {
	w      io.Writer
	file   string
	passed bool
}

func (p *partialPoint) Write(b []byte) (int, error) {
	if p.passed || len(b) < 2 {
		return p.w.Write(b)
	}
	p.passed = true
	n, err := p.w.Write(b[:len(b)/2])
	if err != nil {
		return n, err
	}
	if err := faults.Point("temp-partial", p.file); err != nil {
		return n, err
	}
	m, err := p.w.Write(b[len(b)/2:])
	return n + m, err
}

// syncDir fsyncs a directory so that a rename in it survives a crash. Some
// file systems reject fsync on directories (EINVAL); that is not an error here.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	serr := d.Sync()
	cerr := d.Close()
	if serr != nil && !errors.Is(serr, syscall.EINVAL) {
		return serr
	}
	return cerr
}
