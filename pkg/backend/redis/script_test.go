package redis

import (
	"encoding/binary"
	"math"
	"regexp"
	"slices"
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
		"NEVER":             "-1",
		"NEVER_US":          strconv.FormatInt(int64(algorithms.Never/time.Microsecond), 10),
		"MAX_TTL_MS":        strconv.FormatInt(int64(algorithms.Never/time.Millisecond), 10),
		"REQUEST_BYTES":     strconv.Itoa(requestBytes),
		"ITEM_BYTES":        strconv.Itoa(itemBytes),
		"BIT_OVER":          strconv.Itoa(bitOver),
		"BIT_ACCOUNT":       strconv.Itoa(bitAccount),
		"BIT_REFUND":        strconv.Itoa(bitRefund),
		"MAGIC":             strconv.Itoa(stateMagic),
		"TEST_TTL_SLACK_MS": strconv.FormatInt(testTTLSlack.Milliseconds(), 10),
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

// TestScriptCallLayout: two requests in one call share KEYS; ARGV is one
// string of, per request, now (float64), n (int32, negative for a part of
// a request) and itemBytes per item in the documented layout.
func TestScriptCallLayout(t *testing.T) {
	items := []backend.Item{
		{Key: "a", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1, Window: time.Second}},
		{Key: "b", Limit: algorithms.Limit{Algorithm: algorithms.GCRA, Requests: 7, Window: 3 * time.Second, Burst: 11},
			Hits: 12, Mode: backend.Quota, Group: 5, Account: true},
	}
	first := group{items: []item{encodeItem(items, 0, "p:a"), encodeItem(items, 1, "p:b")}}
	second := group{items: []item{encodeItem(items, 1, "p:b")}}
	sc := newScriptCall(0, 0)
	sc.add(&first, -1, true)
	sc.add(&second, 123, false)
	if len(sc.keys) != 2 || sc.keys[0] != "p:a" || sc.keys[1] != "p:b" {
		t.Fatalf("keys = %q", sc.keys)
	}
	b := sc.args.b
	if len(b) != 2*requestBytes+3*itemBytes {
		t.Fatalf("%d bytes of ARGV, want %d", len(b), 2*requestBytes+3*itemBytes)
	}
	le := binary.LittleEndian
	f64 := func(at int) float64 { return math.Float64frombits(le.Uint64(b[at:])) }
	second0 := requestBytes + 2*itemBytes
	if f64(0) != -1 || int32(le.Uint32(b[8:])) != 2 || f64(second0) != 123 || int32(le.Uint32(b[second0+8:])) != -1 {
		t.Fatalf("request headers: now %v n %d, now %v n %d", f64(0), int32(le.Uint32(b[8:])),
			f64(second0), int32(le.Uint32(b[second0+8:])))
	}
	for _, at := range []int{requestBytes + itemBytes, second0 + requestBytes} { // b in both requests
		got := []float64{float64(le.Uint32(b[at:])), float64(b[at+4]), float64(b[at+5]), float64(b[at+6]),
			float64(le.Uint32(b[at+7:])), f64(at + 11), f64(at + 19), f64(at + 27), f64(at + 35)}
		want := []float64{2, float64(algorithms.GCRA), float64(backend.Quota), bitOver | bitAccount, 0, 7, 3e6, 11, 12}
		if !slices.Equal(got, want) {
			t.Errorf("item at %d: %v, want %v", at, got, want)
		}
	}
}

// TestQuotaGroupRanks: quota groups go in as their rank among the
// request's distinct groups, whatever their numbers.
func TestQuotaGroupRanks(t *testing.T) {
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1, Window: time.Second}
	items := []backend.Item{
		{Key: "a", Limit: l, Mode: backend.Quota, Group: -7},
		{Key: "b", Limit: l, Mode: backend.Enforced, Group: 3},
		{Key: "c", Limit: l, Mode: backend.Quota, Group: 1 << 60},
		{Key: "d", Limit: l, Mode: backend.Quota, Group: -7},
		{Key: "e", Limit: l, Mode: backend.Quota, Group: 2},
	}
	for i, want := range []uint32{0, 0, 1, 0, 2} {
		if got := encodeItem(items, i, "k").group; got != want {
			t.Errorf("item %d: group rank %d, want %d", i, got, want)
		}
	}
}

// TestDecodeRemainingSplit: remaining comes as hi*2^32 + lo, and hi = 2^32
// saturates.
func TestDecodeRemainingSplit(t *testing.T) {
	items := []backend.Item{{Key: "a"}, {Key: "b"}, {Key: "c"}}
	g := &group{idx: []int{0, 1, 2}, reply: []int64{
		1,
		1, 7, 0, 5,
		0 + 2*3, 9, 10, -1,
		1 + 2*(1<<32), 0, 0, 0,
	}}
	out := make([]algorithms.Decision, 3)
	if err := decodeGroup(g, items, out); err != nil {
		t.Fatal(err)
	}
	if !out[0].Allowed || out[0].Remaining != 7 || out[0].ResetAfter != 5*time.Microsecond {
		t.Errorf("item 0: %+v", out[0])
	}
	if out[1].Allowed || out[1].Remaining != 3<<32+9 || out[1].RetryAfter != 10*time.Microsecond || out[1].ResetAfter != algorithms.Never {
		t.Errorf("item 1: %+v", out[1])
	}
	if !out[2].Allowed || out[2].Remaining != math.MaxUint64 {
		t.Errorf("item 2: %+v", out[2])
	}
	g.reply[2] = 1 << 32 // lo out of range
	if err := decodeGroup(g, items, out); err == nil {
		t.Error("a lo of 2^32 was accepted")
	}
}
