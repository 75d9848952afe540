package algorithms

import (
	"math"
	"time"
)

func fixedWindow(l *Limit, w int64, s *State, now int64, hits uint64, account bool) Decision {
	start := now - now%w
	if start < s.at { // the clock stepped back into an earlier window
		start, now = s.at, max(now, s.at)
	}
	var count uint64
	if start == s.at {
		count = s.count
	}
	limit := l.Requests
	left := sub0(limit, count)
	end := micros(w - (now - start))
	if probe(hits) > left {
		if account {
			*s = State{at: start, count: satAdd(count, hits)}
			return accounted(fixedWindow(l, w, s, now, 0, false))
		}
		d := Decision{Limit: limit, Remaining: left, RetryAfter: end, ResetAfter: end}
		if hits > limit {
			d.RetryAfter = Never
		}
		if count == 0 {
			d.ResetAfter = 0
		}
		return d
	}
	count += hits
	d := Decision{Allowed: true, Limit: limit, Remaining: limit - count}
	if count > 0 {
		d.ResetAfter = end
	}
	*s = State{at: start, count: count}
	return d
}

// slidingCounter works in hits scaled by the window (hit·µs), so that with
// counts and windows below 2^53 every quantity is an integer held exactly in
// a float64 and the decisions are exact: used = prev*(w-elapsed) + cur*w
// against a full window of requests*w.
func slidingCounter(l *Limit, w int64, s *State, now int64, hits uint64, account bool) Decision {
	start := now - now%w
	if start < s.at { // the clock stepped back into an earlier window
		start, now = s.at, max(now, s.at)
	}
	var cur, prev uint64
	switch {
	case start == s.at:
		cur, prev = s.count, s.prev
	case start-w == s.at:
		prev = s.count
	}
	elapsed := now - start
	fw := float64(w)
	full := float64(l.Requests) * fw
	used := float64(prev)*float64(w-elapsed) + float64(cur)*fw
	var reset int64
	switch {
	case cur > 0:
		reset = 2*w - elapsed
	case prev > 0:
		reset = w - elapsed
	}
	if p := probe(hits); p > sub0(l.Requests, cur) || used+float64(p)*fw > full {
		if account {
			*s = State{at: start, count: satAdd(cur, hits), prev: prev}
			return accounted(slidingCounter(l, w, s, now, 0, false))
		}
		d := Decision{Limit: l.Requests, Remaining: floorU((full - used) / fw), ResetAfter: micros(reset)}
		switch {
		case p > l.Requests:
			d.RetryAfter = Never
		case p <= sub0(l.Requests, cur):
			// Within this window, once enough of the previous one slides out:
			// prev*(w-e) <= (requests-cur-p)*w.
			need := float64(l.Requests-cur-p) * fw
			e := w - floorDiv(need, float64(prev), w)
			d.RetryAfter = micros(e - elapsed)
		default:
			// In the next window, where this window's count becomes prev:
			// cur*(w-e) <= (requests-p)*w.
			need := float64(l.Requests-p) * fw
			e := w - floorDiv(need, float64(cur), w)
			d.RetryAfter = micros(w + e - elapsed)
		}
		return d
	}
	cur += hits
	used += float64(hits) * fw
	if hits > 0 {
		reset = 2*w - elapsed
	}
	d := Decision{Allowed: true, Limit: l.Requests, Remaining: floorU((full - used) / fw), ResetAfter: micros(reset)}
	*s = State{at: start, count: cur, prev: prev}
	return d
}

// bucket decides TokenBucket and GCRA, which are one limiter in two
// vocabularies. The state is the time of the last update and the debt: the
// tokens missing from a full bucket scaled by the window (token·µs), which is
// also GCRA's theoretical arrival time minus now scaled by requests. A hit
// adds w to the debt, every µs takes requests off it, and a request fits
// while the debt stays within capacity*w. With values below 2^53 every
// quantity is an integer held exactly in a float64, so fractional emission
// intervals (7 per minute) decide exactly.
func bucket(l *Limit, w int64, s *State, now int64, hits uint64, account bool) Decision {
	if now < s.at { // the clock stepped back
		now = s.at
	}
	capacity := l.Capacity()
	fw, rate := float64(w), float64(l.Requests)
	full := float64(capacity) * fw
	debt := s.level - float64(now-s.at)*rate
	if debt < 0 {
		debt = 0
	}
	need := debt + float64(hits)*fw
	if p := probe(hits); p > capacity || debt+float64(p)*fw > full {
		if account {
			// The debt is capped at one window's worth of the limit below
			// empty (see MaxDebt), so that one huge report cannot lock the
			// key for years.
			*s = State{at: now, level: min(need, full+float64(l.Requests)*fw)}
			return accounted(bucket(l, w, s, now, 0, false))
		}
		d := Decision{
			Limit:      capacity,
			Remaining:  floorU((full - debt) / fw),
			RetryAfter: Never,
			ResetAfter: ceilMicros(debt / rate),
		}
		if p <= capacity {
			d.RetryAfter = ceilMicros((debt + float64(p)*fw - full) / rate)
		}
		return d
	}
	d := Decision{
		Allowed:    true,
		Limit:      capacity,
		Remaining:  floorU((full - need) / fw),
		ResetAfter: ceilMicros(need / rate),
	}
	*s = State{at: now, level: need}
	return d
}

func slidingLog(l *Limit, w int64, s *State, now int64, hits uint64, account bool) Decision {
	if now < s.at { // the clock stepped back
		now = s.at
	}
	log, count := s.log, s.count
	if now != s.at {
		// A new instant: only s itself needs protecting (see ring.keep).
		log.keep = 0
	}
	for log.n > 0 {
		e := log.oldest()
		if e.at > now-w {
			break
		}
		count -= e.hits
		log.dropOldest()
	}
	limit := l.Requests
	left := sub0(limit, count)
	if p := probe(hits); p > left {
		if account {
			if left > 0 { // room in the log: record the whole charge
				log.push(logEntry{at: now, hits: hits})
				count = satAdd(count, hits)
			}
			*s = State{at: now, count: count, log: log}
			return accounted(slidingLog(l, w, s, now, 0, false))
		}
		d := Decision{Limit: limit, Remaining: left}
		if log.n > 0 {
			d.ResetAfter = micros(log.newest().at + w - now)
		}
		if p > limit {
			d.RetryAfter = Never
		} else {
			// Wait until enough of the oldest entries have slid out: the
			// count must come down to limit-p (it may be above the limit
			// after usage accounting).
			need, freed := count+p-limit, uint64(0)
			for i := 0; i < log.n; i++ {
				e := log.at(i)
				freed += e.hits
				if freed >= need {
					d.RetryAfter = micros(e.at + w - now)
					break
				}
			}
		}
		return d
	}
	if hits > 0 {
		log.push(logEntry{at: now, hits: hits})
		count += hits
	}
	d := Decision{Allowed: true, Limit: limit, Remaining: limit - count}
	if log.n > 0 {
		d.ResetAfter = micros(log.newest().at + w - now)
	}
	*s = State{at: now, count: count, log: log}
	return d
}

// sub0 returns a-b, or 0 when b > a.
func sub0(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// floorDiv returns floor(num/den) clamped to [0, max]; a zero den gives max.
func floorDiv(num, den float64, max int64) int64 {
	q := math.Floor(num / den)
	switch {
	case !(q < float64(max)): // also NaN and +Inf
		return max
	case !(q > 0):
		return 0
	}
	return int64(q)
}

// floorU returns floor(f) as a uint64, clamped to [0, MaxUint64].
func floorU(f float64) uint64 {
	switch {
	case !(f > 0): // also NaN
		return 0
	case f >= math.MaxUint64:
		return math.MaxUint64
	}
	return uint64(math.Floor(f))
}

// micros converts µs to a Duration, saturating at Never.
func micros(us int64) time.Duration {
	switch {
	case us <= 0:
		return 0
	case us >= int64(Never/time.Microsecond):
		return Never
	}
	return time.Duration(us) * time.Microsecond
}

// ceilMicros converts fractional µs to a Duration, rounding up and
// saturating at Never.
func ceilMicros(us float64) time.Duration {
	switch {
	case !(us > 0):
		return 0
	case us >= float64(Never/time.Microsecond):
		return Never
	}
	return micros(int64(math.Ceil(us)))
}
