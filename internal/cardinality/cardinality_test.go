package cardinality

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCapAdmitsUpToMaxThenOverflows(t *testing.T) {
	c := New(3, Overflow)
	for _, v := range []string{"a", "b", "a", "c", "d", "b", "e"} {
		c.Value(v)
	}
	if c.Len() != 3 {
		t.Errorf("Len = %d, want 3", c.Len())
	}
	if got := c.Overflowed(); got != 2 {
		t.Errorf("Overflowed = %d, want 2 (d and e)", got)
	}
	for v, want := range map[string]string{"a": "a", "b": "b", "c": "c", "d": Overflow, "zz": Overflow} {
		if got := c.Value(v); got != want {
			t.Errorf("Value(%q) = %q, want %q", v, got, want)
		}
	}
}

func TestCapZeroMaxAdmitsOne(t *testing.T) {
	c := New(0, "x")
	if c.Max() != 1 || c.Value("a") != "a" || c.Value("b") != "x" {
		t.Errorf("max %d", c.Max())
	}
}

// A flood of distinct values from many goroutines keeps a counter vector
// under the cap plus one overflow series, and loses no count.
func TestCapBoundsSeriesUnderConcurrentFlood(t *testing.T) {
	const max, workers, each = 50, 8, 12_500 // 100,000 distinct values
	c := New(max, Overflow)
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_total", Help: "t"}, []string{"v"})
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				vec.WithLabelValues(c.Value(strconv.Itoa(w*each + i))).Inc()
			}
		}()
	}
	wg.Wait()
	if n := testutil.CollectAndCount(vec); n != max+1 {
		t.Errorf("series = %d, want %d admitted + 1 overflow", n, max+1)
	}
	if got, want := testutil.ToFloat64(vec.WithLabelValues(Overflow)), float64(workers*each-max); got != want {
		t.Errorf("overflow series = %v, want %v", got, want)
	}
	if c.Overflowed() != workers*each-max {
		t.Errorf("Overflowed = %d", c.Overflowed())
	}
}

func BenchmarkCapAdmitted(b *testing.B) {
	c := New(100, Overflow)
	c.Value("rule")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Value("rule")
		}
	})
}

func BenchmarkCapOverflow(b *testing.B) {
	c := New(1, Overflow)
	c.Value("rule")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Value("other")
		}
	})
}

func TestShortenBoundsLengthAndIsStable(t *testing.T) {
	if got := Shorten("short", MaxValueBytes); got != "short" {
		t.Errorf("Shorten(short) = %q", got)
	}
	exact := strings.Repeat("x", MaxValueBytes)
	if got := Shorten(exact, MaxValueBytes); got != exact {
		t.Errorf("a value of exactly MaxValueBytes changed: %q", got)
	}
	long := strings.Repeat("a", 4000)
	a, b := Shorten(long+"1", MaxValueBytes), Shorten(long+"2", MaxValueBytes)
	if len(a) > MaxValueBytes || len(b) > MaxValueBytes {
		t.Errorf("lengths %d, %d, want at most %d", len(a), len(b), MaxValueBytes)
	}
	if a == b {
		t.Errorf("values differing past the prefix map to one label %q", a)
	}
	if again := Shorten(long+"1", MaxValueBytes); again != a {
		t.Errorf("not stable: %q then %q", a, again)
	}
	if !strings.HasPrefix(a, long[:MaxValueBytes-17]+"~") {
		t.Errorf("%q does not keep the prefix", a)
	}
	// A multi-byte rune across the cut is dropped whole, never split.
	uni := strings.Repeat("é", 100) // 200 bytes
	s := Shorten(uni, 64)
	if !utf8.ValidString(s) || len(s) > 64 {
		t.Errorf("Shorten(é x 100, 64) = %q (%d bytes), want valid UTF-8 within 64", s, len(s))
	}
}

// Values that are not UTF-8 become valid labels Prometheus accepts, within
// the bound, one series each; valid ones are as Shorten leaves them.
func TestLabelOfInvalidUTF8(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t"}, []string{"l"})
	seen := map[string]string{}
	for _, v := range []string{
		"\xff", "\xfe", "a\xff", `a\xff`, "\xed\xa0\x80", strings.Repeat("\xff", 4000), strings.Repeat("\xff", 4000) + "x",
		strings.Repeat("é", 100) + "\xff", "ok", strings.Repeat("a", 4000),
	} {
		l := Label(v, MaxValueBytes)
		if !utf8.ValidString(l) || len(l) > MaxValueBytes {
			t.Errorf("Label(%q) = %q (%d bytes): want valid UTF-8 within %d", v, l, len(l), MaxValueBytes)
		}
		if _, err := vec.GetMetricWithLabelValues(l); err != nil {
			t.Errorf("Label(%q) = %q: %v", v, l, err)
		}
		if utf8.ValidString(v) && l != Shorten(v, MaxValueBytes) {
			t.Errorf("Label(%q) = %q, want Shorten's %q", v, l, Shorten(v, MaxValueBytes))
		}
		if other, dup := seen[l]; dup {
			t.Errorf("%q and %q share the label %q", other, v, l)
		}
		seen[l] = v
		if again := Label(v, MaxValueBytes); again != l {
			t.Errorf("not stable: %q then %q", l, again)
		}
	}
	if got := Label("a\xffb", MaxValueBytes); !strings.HasPrefix(got, `a\xffb~`) {
		t.Errorf("Label(a 0xff b) = %q, want the escaped value first", got)
	}
}
