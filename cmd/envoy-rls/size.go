package main

import (
	"errors"
	"math"
	"strconv"
	"strings"
)

// byteSize is a flag value of bytes: a whole number of bytes (1048576), or a
// number with a unit, decimal (kB, MB, GB, TB: powers of 1000) or binary
// (KiB, MiB, GiB, TiB: powers of 1024), e.g. 256MiB, 1GB, 1.5GiB. Units are
// read without regard to case, with or without a space before them, and a
// trailing B alone means bytes.
type byteSize uint64

var sizeUnits = []struct {
	name string
	mult uint64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"b", 1},
}

const sizeSyntax = "want bytes, such as 1048576, 256MiB or 1GB (units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"

func (s *byteSize) UnmarshalText(b []byte) error {
	v, err := parseSize(string(b))
	if err != nil {
		return err
	}
	*s = byteSize(v)
	return nil
}

func parseSize(text string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(text))
	mult := uint64(1)
	for _, u := range sizeUnits {
		if num, ok := strings.CutSuffix(t, u.name); ok {
			t, mult = strings.TrimSpace(num), u.mult
			break
		}
	}
	if t == "" {
		return 0, errors.New(sizeSyntax)
	}
	if n, err := strconv.ParseUint(t, 10, 64); err == nil {
		if n > math.MaxUint64/mult {
			return 0, errors.New("too large")
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) || strings.ContainsAny(t, "xp_") {
		return 0, errors.New(sizeSyntax)
	}
	v := f * float64(mult)
	if v >= math.MaxUint64 {
		return 0, errors.New("too large")
	}
	if v != math.Trunc(v) {
		return 0, errors.New("not a whole number of bytes")
	}
	return uint64(v), nil
}

// MarshalText writes the size in the largest binary unit that divides it.
func (s byteSize) MarshalText() ([]byte, error) {
	return []byte(formatSize(uint64(s))), nil
}

func formatSize(v uint64) string {
	for _, u := range []struct {
		name string
		mult uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v >= u.mult && v%u.mult == 0 {
			return strconv.FormatUint(v/u.mult, 10) + u.name
		}
	}
	return strconv.FormatUint(v, 10)
}
