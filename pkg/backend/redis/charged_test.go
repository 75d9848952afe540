package redis

import (
	"slices"
	"testing"
)

// TestChargedItemsCountsAccounting: a call Redis ran late (its caller had
// left and the fallback decided) charged its usage accounting whatever
// the verdict, so the write-back must not charge it again; an ordinary
// item counts as charged only when its request committed and it allowed.
func TestChargedItemsCountsAccounting(t *testing.T) {
	reply := func(verdict int64, allowed ...bool) []int64 {
		out := []int64{verdict}
		for _, a := range allowed {
			var v int64
			if a {
				v = 1
			}
			out = append(out, v, 0, 0, 0)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		bits  []uint8
		reply []int64
		want  []bool
	}{
		{"committed", []uint8{0, 0}, reply(1, true, false), []bool{true, false}},
		{"denied: nothing but accounting", []uint8{bitAccount, 0}, reply(0, false, true), []bool{true, false}},
		{"accounting that did not fit", []uint8{bitAccount | bitOver}, reply(0, false), []bool{true}},
		{"nothing charged", []uint8{0}, reply(0, true), nil},
	} {
		c := &call{items: len(tc.bits)}
		g := group{reply: tc.reply}
		for i, b := range tc.bits {
			g.idx = append(g.idx, i)
			g.items = append(g.items, item{bits: b})
		}
		c.groups = []group{g}
		if got := chargedItems(c); !slices.Equal(got, tc.want) {
			t.Errorf("%s: charged %v, want %v", tc.name, got, tc.want)
		}
	}
}
