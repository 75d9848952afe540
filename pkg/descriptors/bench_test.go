package descriptors

import (
	"fmt"
	"strings"
	"testing"
)

// benchConfig has 100 exact values, 10 wildcards and a default for one
// key, and a three-level tree.
func benchConfig(b *testing.B) *Domain {
	var s strings.Builder
	s.WriteString("domain: bench\ndescriptors:\n")
	for i := 0; i < 100; i++ {
		fmt.Fprintf(&s, "  - key: path\n    value: /exact/%d\n    rate_limit: {unit: second, requests_per_unit: 10}\n", i)
	}
	for i := 0; i < 10; i++ {
		fmt.Fprintf(&s, "  - key: path\n    value: /wild/%d/*/end\n    rate_limit: {unit: second, requests_per_unit: 10}\n", i)
	}
	s.WriteString(`  - key: path
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: tenant
    value: acme
    descriptors:
      - key: plan
        value: "pro*"
        descriptors:
          - key: user
            rate_limits:
              - {unit: second, requests_per_unit: 10}
              - {unit: hour, requests_per_unit: 1000}
`)
	return mustDomain(b, mustParse(b, s.String()), "bench")
}

func BenchmarkMatch(b *testing.B) {
	d := benchConfig(b)
	cases := []struct {
		name    string
		request []Entry
		depth   int
	}{
		{"exact", []Entry{{"path", "/exact/57"}}, 1},
		{"wildcard", []Entry{{"path", "/wild/9/some/long/path/end"}}, 1},
		{"default", []Entry{{"path", "/other"}}, 1},
		{"nested3", []Entry{{"tenant", "acme"}, {"plan", "pro-annual"}, {"user", "u-1234"}}, 3},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			path := make([]*Node, 0, 8)
			b.ReportAllocs()
			for b.Loop() {
				path = d.Match(c.request, path[:0])
			}
			if len(path) != c.depth {
				b.Fatalf("matched %d levels, want %d", len(path), c.depth)
			}
		})
	}
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			path := make([]*Node, 0, 8)
			i := 0
			for pb.Next() {
				c := cases[i%len(cases)]
				if path = d.Match(c.request, path[:0]); len(path) != c.depth {
					b.Errorf("%s matched %d levels", c.name, len(path))
					return
				}
				i++
			}
		})
	})
}

func BenchmarkStatsKey(b *testing.B) {
	d := mustDomain(b, mustParse(b, `
domain: bench
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 10}
`), "bench")
	for _, key := range []string{"plain", "detailed"} {
		b.Run(key, func(b *testing.B) {
			es := []Entry{{key, "value"}}
			n := d.Match(es, nil)[0]
			b.ReportAllocs()
			for b.Loop() {
				_ = n.StatsKey(es)
			}
		})
	}
}
