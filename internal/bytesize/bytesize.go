// Package bytesize parses and formats byte sizes as the binaries' size flags take
// them ("4GiB", "512MiB", a number of bytes): one definition for the daemon's
// and the relay's --max-body and every other size flag.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the units a byte size takes, by suffix (case-insensitive): the
// binary ones (KiB = 1024) and, with the same meaning, their short forms (K, KB, …:
// a size flag counts in binary units, as du and ls -h do).
var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"tib", 1 << 40}, {"gib", 1 << 30}, {"mib", 1 << 20}, {"kib", 1 << 10},
	{"tb", 1 << 40}, {"gb", 1 << 30}, {"mb", 1 << 20}, {"kb", 1 << 10},
	{"t", 1 << 40}, {"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10},
	{"b", 1}, {"", 1},
}

// Parse parses a byte size: a non-negative integer with an optional unit, B,
// KiB, MiB, GiB or TiB (or K, M, G, T; KB, MB, GB, TB, all binary), case-insensitive:
// "4GiB", "4g", "100000" (bytes). A fractional or negative number, an unknown unit
// or a size over math.MaxInt64 is an error.
func Parse(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for _, u := range sizeUnits {
		num, ok := strings.CutSuffix(t, u.suffix)
		if !ok {
			continue
		}
		num = strings.TrimSpace(num)
		if num == "" || num[0] < '0' || num[0] > '9' {
			continue
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n > math.MaxInt64/u.mult {
			return 0, fmt.Errorf("%q is not a size: give a whole number of bytes with an optional unit, e.g. 4GiB or 512MiB", s)
		}
		return n * u.mult, nil
	}
	return 0, fmt.Errorf("%q is not a size: give a whole number of bytes with an optional unit, e.g. 4GiB or 512MiB", s)
}

// Format writes n bytes in the largest binary unit that divides it exactly
// (4 << 30 is "4GiB", 97280 is "95KiB", 1000 is "1000B"), so that Parse(Format(n)) == n.
func Format(n int64) string {
	for _, u := range []struct {
		name string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
