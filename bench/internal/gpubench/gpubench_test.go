package gpubench

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

// TestLinkRate reads made-up sysfs entries of a gen4 x16 and a gen2 x8
// link and refuses broken ones.
func TestLinkRate(t *testing.T) {
	dir := t.TempDir()
	dev := func(pci, speed, width string) {
		p := filepath.Join(dir, pci)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]string{"current_link_speed": speed, "current_link_width": width} {
			if v == "" {
				continue
			}
			if err := os.WriteFile(filepath.Join(p, name), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	dev("0000:3b:00.0", "16.0 GT/s PCIe", "16")
	dev("0000:05:00.0", "5.0 GT/s PCIe", "8")
	dev("0000:06:00.0", "Unknown", "16")
	dev("0000:07:00.0", "8.0 GT/s PCIe", "")
	for _, c := range []struct {
		pci  string
		want float64
		desc string
	}{
		{"0000:3B:00", 16e9 * 128 / 130 / 8 * 16, "PCIe 4.0 x16 (16 GT/s)"}, // 31.5 GB/s
		{"0000:05:00.0", 5e9 * 0.8 / 8 * 8, "PCIe 2.0 x8 (5 GT/s)"},         // 4 GB/s
	} {
		r, d, err := LinkRate(dir, c.pci)
		if err != nil || math.Abs(r-c.want) > 1 || d != c.desc {
			t.Errorf("%s: %g B/s %q %v, want %g %q", c.pci, r, d, err, c.want, c.desc)
		}
	}
	for _, pci := range []string{"0000:06:00", "0000:07:00", "0000:08:00", ""} {
		if r, _, err := LinkRate(dir, pci); err == nil {
			t.Errorf("%q: %g B/s, want an error", pci, r)
		}
	}
}

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{4, 1, 3, 2})
	if s.Median != 2.5 || s.Min != 1 || s.Max != 4 || s.N != 4 || s.Spread() != 3/2.5 {
		t.Errorf("%+v", s)
	}
}
