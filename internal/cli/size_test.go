package cli

import (
	"math"
	"testing"
)

// ParseSize takes whole numbers with binary units in any case and refuses what is
// not a size (fractions, negatives, unknown units, overflow); FormatSize writes
// what ParseSize reads back to the same number.
func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "100000": 100000, "4GiB": 4 << 30, "4gib": 4 << 30, "4G": 4 << 30, "4 GB": 4 << 30,
		"512MiB": 512 << 20, "95k": 95 << 10, "1TiB": 1 << 40, "7b": 7, " 12 ": 12,
	} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1", "1.5GiB", "4 PiB", "4x", "9223372036854775807k", "1e9"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
	for _, n := range []int64{0, 1, 1000, 97280, 4 << 30, 1<<40 + 1, math.MaxInt64} {
		s := FormatSize(n)
		if back, err := ParseSize(s); err != nil || back != n {
			t.Errorf("ParseSize(FormatSize(%d) = %q) = %d, %v", n, s, back, err)
		}
	}
	if s := FormatSize(4 << 30); s != "4GiB" {
		t.Errorf("FormatSize(4 GiB) = %q", s)
	}
}
