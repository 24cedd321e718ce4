package gpubundle

import (
	"debug/elf"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// allowedLibs are the shared libraries a bundle binary may need where it
// runs: the C library's parts, which every Linux machine has, and the
// NVIDIA driver's libcuda, which package cuda's driver API calls link
// (github.com/barnex/cuda5/cu: -lcuda) and which a GPU machine has by
// definition. Anything else (libcudart, libstdc++, libcublas, libnccl,
// libmpi) would not be there on a machine with only the driver.
var allowedLibs = regexp.MustCompile(`^(libc|libm|libdl|libpthread|librt|libcuda)\.so(\.[0-9]+)*$|^ld-linux-x86-64\.so\.2$`)

// TestBundleDeps checks the ELF files in LSP_BUNDLE_DEPS (space-separated;
// make gpu-bundle sets it to the bundle's binary and the test binaries it
// embeds): their DT_NEEDED libraries, and the newest glibc symbol version
// they import, which is the oldest glibc they run on.
func TestBundleDeps(t *testing.T) {
	files := strings.Fields(os.Getenv("LSP_BUNDLE_DEPS"))
	if len(files) == 0 {
		t.Skip("LSP_BUNDLE_DEPS not set: make gpu-bundle runs this on the bundle's binaries")
	}
	oldest := ""
	for _, path := range files {
		f, err := elf.Open(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, l := range libs {
			if !allowedLibs.MatchString(l) {
				t.Errorf("%s needs %s at run time; a bundle binary may need only libc, libm, libdl, libpthread, librt and the driver's libcuda", path, l)
			}
		}
		syms, err := f.ImportedSymbols()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		need := ""
		for _, s := range syms {
			if strings.HasPrefix(s.Version, "GLIBC_") && glibcLess(need, s.Version) {
				need = s.Version
			}
		}
		f.Close()
		slices.Sort(libs)
		t.Logf("%s: needs %s; glibc %s or newer", path, strings.Join(libs, ", "), strings.TrimPrefix(need, "GLIBC_"))
		if glibcLess(oldest, need) {
			oldest = need
		}
	}
	t.Logf("the bundle runs on glibc %s or newer (the newest versioned glibc symbol its binaries import)", strings.TrimPrefix(oldest, "GLIBC_"))
}

// glibcLess says whether version a ("GLIBC_2.17", or "" for none) is older
// than b.
func glibcLess(a, b string) bool {
	if a == "" {
		return b != ""
	}
	return slices.Compare(glibcParts(a), glibcParts(b)) < 0
}

func glibcParts(v string) []int {
	var out []int
	for _, p := range strings.Split(strings.TrimPrefix(v, "GLIBC_"), ".") {
		n, err := strconv.Atoi(p)
		if err != nil {
			return out
		}
		out = append(out, n)
	}
	return out
}

func TestGlibcLess(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{{"", "GLIBC_2.2.5", true}, {"GLIBC_2.2.5", "GLIBC_2.17", true}, {"GLIBC_2.34", "GLIBC_2.4", false}, {"GLIBC_2.17", "GLIBC_2.17", false}} {
		if got := glibcLess(tc.a, tc.b); got != tc.want {
			t.Errorf("glibcLess(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
