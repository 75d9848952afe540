package rlqs

import (
	"math"
	"slices"
)

// Shares are counted in whole tokens per fill interval: Envoy's token
// bucket takes an integer tokens_per_fill and max_tokens, and truncates
// fill_interval to whole seconds (a sub-second interval is an unlimited
// bucket), so a bucket's fill interval F is a whole number of seconds
// chosen so that the limit's rate times F is many tokens: every share is
// then some whole number of tokens per F, with a rounding error below one
// token per F.

// minTokensPerFill is the fewest tokens the whole limit should be per fill
// interval: a share's rounding error is then below 1% of the limit.
const minTokensPerFill = 100

// tokensPerSubscriber is the fewest tokens per fill interval wanted for
// each subscriber of a bucket, so that even a shared limit gives each
// Envoy a few tokens per interval.
const tokensPerSubscriber = 4

// maxFillInterval bounds a fill interval (about 3 years): limits slower
// than a few requests in that long are not expressed in whole tokens for
// every Envoy (see waterfill for who gets what then).
const maxFillInterval = int64(1e8)

// fillLadder lists the fill intervals chosen from, in seconds: 1, 2, 5, 10,
// 20, 50, ... up to maxFillInterval.
var fillLadder = func() []int64 {
	var l []int64
	for scale := int64(1); scale <= maxFillInterval; scale *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if v := m * scale; v <= maxFillInterval {
				l = append(l, v)
			}
		}
	}
	return l
}()

// pickFill returns the fill interval, in whole seconds, for a limit of
// rate requests per second shared by subs subscribers: the smallest value
// of fillLadder that makes the limit at least minTokensPerFill tokens and
// tokensPerSubscriber per subscriber. cur, the interval in use (0 for
// none), is kept while it is long enough and at most ten times what is
// needed, so the interval does not move back and forth as subscribers come
// and go. The interval also keeps rate × F within a uint32 (Envoy's
// tokens_per_fill).
func pickFill(rate float64, subs int, cur int64) int64 {
	if !(rate > 0) {
		return 1
	}
	need := float64(max(minTokensPerFill, tokensPerSubscriber*subs)) / rate
	ceiling := maxFillInterval
	if c := int64(float64(math.MaxUint32) / rate); c < ceiling {
		ceiling = max(c, 1)
	}
	if cur > 0 && float64(cur) >= need && float64(cur) <= 10*need && cur <= ceiling {
		return cur
	}
	f := fillLadder[len(fillLadder)-1]
	for _, v := range fillLadder {
		if float64(v) >= need {
			f = v
			break
		}
	}
	return min(f, ceiling)
}

// claim is one subscriber's part in a bucket's water-filling.
type claim struct {
	want int64  // tokens per fill interval it could use
	held int64  // tokens per fill interval it holds now
	tie  uint64 // stable order among equals (a hash of its identity)
}

// waterfill divides total tokens among claims max-min fairly: every claim
// gets its want when the claims that want less leave enough, and the
// claims that want more share the rest equally (the water level). The
// tokens left over by rounding the level down go one each to the claims
// that hold most now (so a share does not hop between subscribers), then
// by tie. When total is below the number of claims, the level is 0 and
// those first claims get one token each; the rest get none (a closed
// bucket until a token frees up). out receives one share per claim, in claims' order;
// the shares never sum above total and none exceeds its want.
func waterfill(total int64, claims []claim, out []int64) []int64 {
	out = slices.Grow(out[:0], len(claims))[:len(claims)]
	if len(claims) == 0 {
		return out
	}
	total = max(total, 0)
	order := make([]int, len(claims))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		ca, cb := claims[a], claims[b]
		switch {
		case ca.want != cb.want:
			return cmpInt(ca.want, cb.want)
		case ca.held != cb.held:
			return cmpInt(cb.held, ca.held)
		}
		return cmpU(ca.tie, cb.tie)
	})
	left, k := total, int64(len(claims))
	i := 0
	for ; i < len(order); i++ {
		c := claims[order[i]]
		if w := max(c.want, 0); w <= left/k {
			out[order[i]] = w
			left -= w
			k--
			continue
		}
		break
	}
	rest := order[i:]
	if len(rest) == 0 {
		return out
	}
	level := left / int64(len(rest))
	extra := left - level*int64(len(rest))
	for _, j := range rest {
		out[j] = level
	}
	// The rounding remainder, one token each, to those holding most.
	slices.SortFunc(rest, func(a, b int) int {
		ca, cb := claims[a], claims[b]
		if ca.held != cb.held {
			return cmpInt(cb.held, ca.held)
		}
		return cmpU(ca.tie, cb.tie)
	})
	for _, j := range rest {
		if extra == 0 {
			break
		}
		if out[j] < claims[j].want {
			out[j]++
			extra--
		}
	}
	return out
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
