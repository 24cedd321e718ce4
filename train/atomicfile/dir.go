// Directories written as a whole (WriteDir) and the clean-up of what a
// killed writer leaves behind (Clean).
//
// Limits: the swap of a new directory for an old one is atomic where the
// kernel and file system support renameat2's RENAME_EXCHANGE (Linux ext4,
// xfs, btrfs, tmpfs); elsewhere the old directory is first moved aside to
// .NAME.old-*, and a crash between the two renames leaves no NAME but
// the complete old one aside, which Clean puts back.

package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/faults"
)

// WriteDir writes the directory path as a whole: fn fills a new temp
// directory beside it (.NAME.tmp-*), which is fsynced and then replaces
// path, whose old content is removed only after the new one is in place.
// A reader (or a crash) sees the complete old directory or the complete
// new one, never a mix. On error the temp directory is removed and path
// is untouched. fn should write its files durably (WriteFile does).
func WriteDir(path string, perm os.FileMode, fn func(tmp string) error) (err error) {
	path = filepath.Clean(path)
	parent, base := splitTarget(path)
	tmp, err := os.MkdirTemp(parent, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("atomicfile: create temp directory for %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err = os.Chmod(tmp, perm); err != nil {
		return fmt.Errorf("atomicfile: write %s: chmod %s: %w", path, tmp, err)
	}
	if err = fn(tmp); err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", path, err)
	}
	if err = syncDir(tmp); err != nil {
		return fmt.Errorf("atomicfile: write %s: fsync %s: %w", path, tmp, err)
	}
	if err = faults.Point("dir-written", base); err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", path, err)
	}
	old, err := swapDir(tmp, path)
	if err != nil {
		return fmt.Errorf("atomicfile: replace %s: %w", path, err)
	}
	// The new directory is in place: from here no error may remove it.
	if perr := faults.Point("dir-renamed", base); perr != nil {
		return fmt.Errorf("atomicfile: after replacing %s: %w", path, perr)
	}
	if old != "" {
		if rerr := os.RemoveAll(old); rerr != nil {
			return fmt.Errorf("atomicfile: remove the old %s: %w", path, rerr)
		}
	}
	if serr := syncDir(parent); serr != nil {
		return fmt.Errorf("atomicfile: fsync directory of %s: %w", path, serr)
	}
	return nil
}

// swapDir puts the directory tmp at path and returns where the old
// directory at path went ("" when there was none).
func swapDir(tmp, path string) (old string, err error) {
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return "", os.Rename(tmp, path)
	}
	if err := exchange(tmp, path); err == nil {
		return tmp, nil // tmp now holds the old directory
	}
	// No atomic exchange here: move the old one aside first.
	parent, base := splitTarget(path)
	aside, err := os.MkdirTemp(parent, "."+base+".old-*")
	if err != nil {
		return "", err
	}
	if err := os.Remove(aside); err != nil { // only its unique name is wanted
		return "", err
	}
	if err := os.Rename(path, aside); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Rename(aside, path) // put the old one back
		return "", err
	}
	return aside, nil
}

// Clean removes what writers of this package that were killed left in
// dir: temp files and directories (.NAME.tmp-*), and old directories
// moved aside (.NAME.old-*), which go back to NAME when NAME is missing.
// It returns the names it removed or restored.
func Clean(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("atomicfile: clean %s: %w", dir, err)
	}
	var done []string
	var errs []error
	for _, e := range ents {
		name := e.Name()
		target, kind, ok := leftover(name)
		if !ok {
			continue
		}
		p := filepath.Join(dir, name)
		if kind == "old" {
			if _, err := os.Lstat(filepath.Join(dir, target)); errors.Is(err, os.ErrNotExist) {
				if err := os.Rename(p, filepath.Join(dir, target)); err != nil {
					errs = append(errs, err)
				} else {
					done = append(done, name)
				}
				continue
			}
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, name)
	}
	if err := errors.Join(errs...); err != nil {
		return done, fmt.Errorf("atomicfile: clean %s: %w", dir, err)
	}
	return done, nil
}

// leftover says whether name is a temp (.NAME.tmp-*) or aside
// (.NAME.old-*) entry of this package, and for which NAME.
func leftover(name string) (target, kind string, ok bool) {
	if !strings.HasPrefix(name, ".") {
		return "", "", false
	}
	for _, k := range []string{"tmp", "old"} {
		if i := strings.LastIndex(name, "."+k+"-"); i > 1 {
			return name[1:i], k, true
		}
	}
	return "", "", false
}
