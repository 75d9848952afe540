package rlqs

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestWaterfillMaxMin: on random claims, the shares sum to at most the
// total (to it when the claims want at least that), none exceeds its want,
// and they are max-min fair: a claim that gets less than it wants gets at
// least as much as any other claim, less one rounding token.
func TestWaterfillMaxMin(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 2000 {
		k := 1 + r.IntN(12)
		total := int64(r.IntN(500))
		claims := make([]claim, k)
		wantSum := int64(0)
		for i := range claims {
			claims[i] = claim{want: int64(1 + r.IntN(200)), held: int64(r.IntN(100)), tie: r.Uint64()}
			wantSum += claims[i].want
		}
		out := waterfill(total, claims, nil)
		sum := int64(0)
		for i, v := range out {
			if v < 0 || v > claims[i].want {
				t.Fatalf("case %d: share %d of claim %+v", n, v, claims[i])
			}
			sum += v
		}
		if sum > total || (sum < min(total, wantSum)) {
			t.Fatalf("case %d: shares sum to %d of %d (wants %d): %v %+v", n, sum, total, wantSum, out, claims)
		}
		for i := range out {
			if out[i] >= claims[i].want {
				continue
			}
			for j := range out {
				if out[j] > out[i]+1 {
					t.Fatalf("case %d: claim %d is short (%d of %d) while claim %d gets %d", n, i, out[i], claims[i].want, j, out[j])
				}
			}
		}
	}
}

// TestWaterfillTooFewTokens: with fewer tokens than claims, those holding
// a token keep it and the rest get none.
func TestWaterfillTooFewTokens(t *testing.T) {
	claims := []claim{{want: 5, held: 0, tie: 1}, {want: 5, held: 1, tie: 2}, {want: 5, held: 0, tie: 3}, {want: 5, held: 1, tie: 4}}
	got := waterfill(2, claims, nil)
	if want := []int64{0, 1, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := waterfill(-3, claims, nil); !slices.Equal(got, []int64{0, 0, 0, 0}) {
		t.Fatalf("negative total: %v", got)
	}
}

// TestPickFill: the fill interval makes the limit at least 100 tokens and
// 4 per subscriber, within a uint32, keeps a current interval that still
// fits, and is a whole number of seconds from the ladder.
func TestPickFill(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		subs int
		cur  int64
		want int64
	}{
		{1000, 1, 0, 1},
		{100, 1, 0, 1},
		{10, 1, 0, 10},
		{10, 30, 0, 20},    // 120 tokens for 30 subscribers
		{10, 30, 50, 50},   // 50 still fits and is within 10x
		{10, 1, 500, 10},   // 500 is over 10x what is needed
		{10, 300, 20, 200}, // 20 is too short for 300
		{1.0 / 3600, 1, 0, 500000},
		{1e12, 1, 0, 1}, // capped to keep tokens in a uint32
		{0, 1, 0, 1},
	} {
		if got := pickFill(tc.rate, tc.subs, tc.cur); got != tc.want {
			t.Errorf("pickFill(%v, %d, %d) = %d, want %d", tc.rate, tc.subs, tc.cur, got, tc.want)
		}
	}
	for _, rate := range []float64{1e-6, 0.01, 3, 7e5, 4e9} {
		f := pickFill(rate, 10, 0)
		if f < 1 || f > maxFillInterval || rate*float64(f) > math.MaxUint32+1 {
			t.Errorf("pickFill(%v) = %d", rate, f)
		}
	}
}

// TestTokenBucketEncoding: a change of the fill interval alone would be
// ignored by Envoy, so the encoder changes tokens_per_fill (or max_tokens)
// with it.
func TestTokenBucketEncoding(t *testing.T) {
	prev := sent{tb: true, fill: 10, tokens: 50, burst: 20}
	for i, tc := range []struct {
		prev                sent
		fill, tokens, burst int64
		want                sent
	}{
		{prev, 10, 50, 20, sent{true, 10, 50, 20}}, // unchanged: Envoy keeps its bucket
		{prev, 20, 100, 40, sent{true, 20, 100, 40}},
		{prev, 20, 50, 20, sent{true, 20, 49, 20}}, // only the interval changed
		{sent{tb: true, fill: 1, tokens: 1, burst: 3}, 2, 1, 3, sent{true, 2, 1, 2}},
		{sent{tb: true, fill: 1, tokens: 1, burst: 1}, 2, 1, 1, sent{true, 2, 1, 2}},
		{closed, 5, 1, 1, sent{true, 5, 1, 2}}, // from a zero share
		{sent{}, 5, 7, 0, sent{true, 5, 7, 1}}, // Envoy never admits with max_tokens 0
	} {
		got := tokenBucket(tc.prev, tc.fill, tc.tokens, tc.burst)
		if tc.prev.tb && got.fill != tc.prev.fill && got.tokens == tc.prev.tokens && got.burst == tc.prev.burst {
			t.Errorf("case %d: %+v after %+v differs in the fill interval only", i, got, tc.prev)
		}
		if got != tc.want {
			t.Errorf("case %d: got %+v, want %+v", i, got, tc.want)
		}
	}
}

// TestTTL: whole seconds, at least 1 s, three report periods.
func TestTTL(t *testing.T) {
	for _, tc := range []struct{ period, want time.Duration }{
		{0, 15 * time.Second},
		{5 * time.Second, 15 * time.Second},
		{100 * time.Millisecond, time.Second},
		{700 * time.Millisecond, 3 * time.Second},
	} {
		if got := ttlFor(tc.period); got != tc.want {
			t.Errorf("ttlFor(%v) = %v, want %v", tc.period, got, tc.want)
		}
	}
}

// TestGrantNeverOvercommits: a reservation never takes more than the
// others leave, whatever it asks for.
func TestGrantNeverOvercommits(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 10000 {
		res := Reservation{Target: r.Float64() * 100, Cap: r.Float64() * 100, Fill: int64(1 + r.IntN(60))}
		others := r.Float64() * 120
		g := grant(&res, others)
		rate := float64(g) / float64(res.Fill)
		if rate > res.Target+1e-9 || others+rate > max(res.Cap, others)+1e-9 && rate > 0 {
			t.Fatalf("grant %d/%d for %+v with others %v", g, res.Fill, res, others)
		}
	}
}
