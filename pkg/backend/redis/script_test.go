package redis

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// luaConstants returns the script's top-level numeric constants, from lines
// such as "local FIXED, BUCKET = 0, 1".
func luaConstants(t *testing.T) map[string]string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^local ([A-Z_0-9]+(?:, [A-Z_0-9]+)*) = (-?[0-9]+(?:, -?[0-9]+)*)\b`)
	got := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(applyLua, -1) {
		names, values := strings.Split(m[1], ", "), strings.Split(m[2], ", ")
		if len(names) != len(values) {
			t.Fatalf("script line %q: %d names, %d values", m[0], len(names), len(values))
		}
		for i, n := range names {
			got[n] = values[i]
		}
	}
	return got
}

// TestScriptConstantsMatchGo: the script's copies of algorithms.Kind,
// backend.Mode, algorithms.Never and the argument layout equal Go's, and the
// script knows every algorithm and every mode Go has.
func TestScriptConstantsMatchGo(t *testing.T) {
	luaName := map[algorithms.Kind]string{
		algorithms.FixedWindow:          "FIXED",
		algorithms.TokenBucket:          "BUCKET",
		algorithms.SlidingWindowLog:     "LOG",
		algorithms.SlidingWindowCounter: "COUNTER",
		algorithms.GCRA:                 "GCRA",
	}
	want := map[string]string{
		"NEVER":       "-1",
		"NEVER_US":    strconv.FormatInt(int64(algorithms.Never/time.Microsecond), 10),
		"ITEM_FIELDS": strconv.Itoa(itemFields),
	}
	for _, k := range algorithms.Kinds() {
		name, ok := luaName[k]
		if !ok {
			t.Errorf("algorithm %s has no constant in the script", k)
			continue
		}
		want[name] = strconv.Itoa(int(k))
	}
	modes := 0
	for m := range 256 {
		name := backend.Mode(m).String()
		if strings.HasPrefix(name, "Mode(") {
			continue
		}
		modes++
		want[strings.ToUpper(name)] = strconv.Itoa(m)
	}
	if modes != 3 {
		t.Errorf("found %d modes by name, want 3 (Enforced, Shadow, Quota)", modes)
	}
	got := luaConstants(t)
	for name, w := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("the script has no constant %s (Go: %s)", name, w)
		} else if g != w {
			t.Errorf("the script's %s = %s, Go's = %s", name, g, w)
		}
	}
	if len(got) == 0 {
		t.Fatal("found no constants in the script")
	}
}

// TestMakeGroupLayout: one encoded item has itemFields numbers, each at the
// position its field constant names.
func TestMakeGroupLayout(t *testing.T) {
	items := []backend.Item{
		{Key: "a", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1, Window: time.Second}},
		{Key: "b", Limit: algorithms.Limit{Algorithm: algorithms.GCRA, Requests: 7, Window: 3 * time.Second, Burst: 11},
			Hits: 12, Mode: backend.Quota, Group: 5},
	}
	g := makeGroup(items, []string{"p:a", "p:b"}, []int{0, 1})
	if len(g.keys) != 2 || g.keys[1] != "p:b" {
		t.Fatalf("keys = %q", g.keys)
	}
	f := strings.Fields(g.args)
	if len(f) != 2*itemFields {
		t.Fatalf("%d fields for 2 items: %q", len(f), g.args)
	}
	second := f[itemFields:]
	want := map[int]string{
		fieldKeyIndex:  "2",
		fieldAlgorithm: strconv.Itoa(int(algorithms.GCRA)),
		fieldRequests:  "7",
		fieldWindow:    "3000000",
		fieldCapacity:  "11",
		fieldHits:      "12",
		fieldMode:      strconv.Itoa(int(backend.Quota)),
		fieldGroup:     "5",
		fieldOver:      "1",
	}
	if len(want) != itemFields {
		t.Fatalf("the test checks %d of %d fields", len(want), itemFields)
	}
	for i, w := range want {
		if second[i] != w {
			t.Errorf("field %d = %s, want %s (args %q)", i, second[i], w, g.args)
		}
	}
}
