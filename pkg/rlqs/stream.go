package rlqs

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// stream is one Envoy's stream of one domain. Only its handler goroutine
// uses it.
type stream struct {
	svc          *Service
	id, host     string
	domain       string
	subs         map[uint64]*sub // by idKey
	period       time.Duration   // learned from the reports; 0 until known
	lastPeriodic time.Time
	warned       map[string]bool

	entries []descriptors.Entry // scratch
	path    []*descriptors.Node
}

// sub is one bucket of a stream: a subscription.
type sub struct {
	id  *rlqsv3.BucketId // as Envoy sent it, echoed in every action
	key uint64           // idKey(id)
	cfg *descriptors.Config
	pol policy

	lastAt time.Time // receive time the demand was last measured to
	acc    uint64    // requests since lastAt not yet in demand
	demand float64   // requests per second, -1 until measured
	unused uint64    // allowed requests not yet charged to a budget's ledger
	idle   int       // reports in a row without a request

	fresh    bool  // no assignment sent yet (a subscription)
	fill     int64 // the fill interval of the assignment (s)
	held     int64 // its tokens per fill
	raise    int   // reports in a row that asked for a raise
	last     sent  // what was sent last
	ttl      time.Duration
	capacity float64 // the budget's capacity last seen (requests/s)
	shared   bool    // has an entry in the Shares
}

// rate returns the sub's assigned rate (requests per second).
func (sb *sub) rate() float64 {
	if sb.fill <= 0 {
		return 0
	}
	return float64(sb.held) / float64(sb.fill)
}

// reportPeriod returns the stream's report period, DefaultReportPeriod
// until it has shown one.
func (st *stream) reportPeriod() time.Duration {
	if st.period > 0 {
		return st.period
	}
	return DefaultReportPeriod
}

func (st *stream) idleTimeout() time.Duration {
	base := st.svc.o.IdleTimeout
	if base <= 0 {
		base = minIdleTimeout
	}
	return max(base, 4*st.period)
}

// Bounds of the learned report period.
const (
	minPeriod = 100 * time.Millisecond
	maxPeriod = time.Minute
)

// minDemandInterval is the shortest receive-time interval a demand is
// measured over; the requests of a shorter one wait for the next report.
const minDemandInterval = 100 * time.Millisecond

// headroom is how much more than its measured demand a subscriber is
// offered (the claim it makes in the water-filling); what nobody claims
// stays free for newcomers and for demand that grows.
const headroom = 1.5

// periodic reports whether m is a periodic report (every bucket of the
// stream, or none) rather than Envoy's initial report of one new bucket
// (time_elapsed 0). A reconnect's first report is periodic: its buckets
// existed before, so their time_elapsed is at least a second.
func (st *stream) periodic(m *rlqsv3.RateLimitQuotaUsageReports) bool {
	us := m.GetBucketQuotaUsages()
	if len(us) != 1 {
		return true
	}
	if sb := st.subs[idKey(us[0].GetBucketId())]; sb != nil && sameID(sb.id, us[0].GetBucketId()) {
		return true
	}
	return us[0].GetTimeElapsed().GetSeconds() > 0
}

// handle answers one report: the actions for every bucket it names (a
// new bucket's at once), in one response.
func (st *stream) handle(ctx context.Context, m *rlqsv3.RateLimitQuotaUsageReports, at time.Time) (*rlqsv3.RateLimitQuotaResponse, error) {
	s := st.svc
	s.m.report()
	switch d := m.GetDomain(); {
	case d == "" && st.domain == "":
		return nil, statusInvalid("RLQS report without a domain on a new stream (the first report must name its domain)")
	case d != "" && st.domain == "":
		st.domain = d
	case d != "" && d != st.domain:
		return nil, errDomain(st.domain, d)
	}
	periodic := st.periodic(m)
	if periodic {
		if !st.lastPeriodic.IsZero() {
			iv := min(max(at.Sub(st.lastPeriodic), minPeriod), maxPeriod)
			if st.period == 0 {
				st.period = iv
			} else {
				st.period = (7*st.period + 3*iv) / 10
			}
		}
		st.lastPeriodic = at
	}
	cfg := s.o.Config()
	dom := cfg.Domain(st.domain)
	if dom == nil {
		st.warnOnce("domain", "RLQS stream of a domain the config does not define: its buckets get the unmatched default", "default", s.unmatchedName())
	}
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var work []*sub
	for _, u := range m.GetBucketQuotaUsages() {
		id := u.GetBucketId()
		if len(id.GetBucket()) == 0 {
			s.m.invalid("empty")
			st.warnOnce("empty", "RLQS report with an empty bucket id: ignored (Envoy skips actions for empty ids)")
			continue
		}
		if why := checkID(id); why != "" {
			// DENY_ALL, not the unmatched default: a request must not
			// escape its limit by padding the header its bucket id is
			// made of.
			s.m.invalid("too_large")
			st.warnOnce("large", "RLQS bucket id too large: denied (DENY_ALL) and not kept", "reason", why)
			resp.BucketAction = append(resp.BucketAction, blanket(id, true, ttlFor(st.reportPeriod())))
			continue
		}
		key := idKey(id)
		sb := st.subs[key]
		if sb != nil && !sameID(sb.id, id) {
			// Two ids with one 64-bit key (seeded per process: nobody can
			// aim for it): the second is answered like a refused id.
			s.m.invalid("collision")
			resp.BucketAction = append(resp.BucketAction, blanket(id, true, ttlFor(st.reportPeriod())))
			continue
		}
		fresh := sb == nil
		if fresh {
			if len(st.subs) >= s.o.MaxBucketsPerStream {
				s.m.abandoned("max_buckets_per_stream")
				st.warnOnce("excess", "RLQS stream over --rlqs-max-buckets-per-stream: its further buckets are abandoned", "max", s.o.MaxBucketsPerStream)
				resp.BucketAction = append(resp.BucketAction, abandon(id))
				continue
			}
			if s.buckets.Add(1) > int64(s.o.MaxBuckets) {
				s.buckets.Add(-1)
				s.m.abandoned("max_buckets")
				st.warnOnce("excess-all", "RLQS buckets over --rlqs-max-buckets: further buckets are abandoned", "max", s.o.MaxBuckets)
				resp.BucketAction = append(resp.BucketAction, abandon(id))
				continue
			}
			sb = &sub{id: id, key: key, fresh: true, demand: -1, lastAt: at}
			st.subs[key] = sb
			// A reconnect's first report carries the usage since the
			// last one, over whole seconds: a first estimate.
			if secs := u.GetTimeElapsed().GetSeconds(); secs > 0 {
				sb.demand = float64(u.GetNumRequestsAllowed()+u.GetNumRequestsDenied()) / float64(secs)
			}
		}
		if sb.cfg != cfg || fresh {
			st.match(ctx, sb, cfg, dom)
		}
		count := u.GetNumRequestsAllowed() + u.GetNumRequestsDenied()
		sb.unused += u.GetNumRequestsAllowed()
		if !fresh {
			sb.acc += count
			if dt := at.Sub(sb.lastAt); dt >= minDemandInterval {
				sb.demand = float64(sb.acc) / dt.Seconds()
				sb.acc, sb.lastAt = 0, at
			}
			if periodic {
				if count == 0 {
					sb.idle++
				} else {
					sb.idle = 0
				}
			}
		}
		if s.o.AbandonAfter > 0 && sb.idle >= s.o.AbandonAfter {
			s.m.abandoned("idle")
			resp.BucketAction = append(resp.BucketAction, abandon(sb.id))
			st.drop(ctx, sb, true)
			continue
		}
		switch sb.pol.kind {
		case allowAll, denyAll:
			sb.ttl = ttlFor(st.reportPeriod())
			resp.BucketAction = append(resp.BucketAction, blanket(sb.id, sb.pol.kind == denyAll, sb.ttl))
			st.setLast(sb, sent{})
		default:
			work = append(work, sb)
		}
	}
	st.allocate(ctx, work, at, resp)
	return resp, nil
}

// match (re)matches a sub against the config; a sub whose bucket changes
// gives its share up.
func (st *stream) match(ctx context.Context, sb *sub, cfg *descriptors.Config, dom *descriptors.Domain) {
	old := sb.pol.key
	sb.cfg = cfg
	sb.pol = policy{kind: allowAll, domain: st.domain}
	if st.svc.o.DenyUnmatched {
		sb.pol.kind = denyAll
	}
	if dom != nil {
		st.entries = st.entries[:0]
		for k, v := range sb.id.GetBucket() {
			st.entries = append(st.entries, descriptors.Entry{Key: k, Value: v})
		}
		slices.SortFunc(st.entries, func(a, b descriptors.Entry) int { return strings.Compare(a.Key, b.Key) })
		ordered, path := dom.MatchBucket(st.entries, nil, st.path[:0])
		if path != nil {
			sb.pol = policyFor(st.domain, ordered, path)
		} else {
			st.svc.m.unmatched()
		}
	}
	if old != "" && old != sb.pol.key && sb.shared {
		st.release(ctx, []*sub{{pol: policy{key: old}, shared: true, held: sb.held, fill: sb.fill, ttl: sb.ttl}}, true)
		sb.shared, sb.held, sb.raise = false, 0, 0
		sb.fresh = true
	}
}

// allocate computes, reserves and encodes the shares of the subs of one
// report, appending their actions to resp.
func (st *stream) allocate(ctx context.Context, work []*sub, at time.Time, resp *rlqsv3.RateLimitQuotaResponse) {
	if len(work) == 0 {
		return
	}
	s := st.svc
	period := st.reportPeriod()
	ttl := ttlFor(period)
	caps := s.capacities(ctx, work, period)
	keys := make([]string, 0, len(work))
	seen := map[string]bool{}
	for _, sb := range work {
		if !seen[sb.pol.key] {
			seen[sb.pol.key] = true
			keys = append(keys, sb.pol.key)
		}
	}
	loaded, err := s.shares.Load(ctx, keys)
	if err != nil {
		s.sharesFailed(err, work)
		return
	}
	byKey := make(map[string][]Entry, len(keys))
	for i, k := range keys {
		byKey[k] = loaded[i]
	}
	rs := make([]Reservation, len(work))
	for i, sb := range work {
		rs[i] = st.reservation(sb, byKey[sb.pol.key], caps[i], ttl, period)
	}
	granted := make([]int64, len(rs))
	if err := s.shares.Reserve(ctx, rs, granted); err != nil {
		s.sharesFailed(err, work)
		return
	}
	for i, sb := range work {
		st.assign(sb, rs[i].Fill, granted[i], ttl, period, resp)
	}
}

// reservation computes a sub's target share from its bucket's entries:
// the max-min fair water-filling of the capacity less what gone
// subscribers still hold, in whole tokens per fill interval, with the
// hysteresis.
func (st *stream) reservation(sb *sub, entries []Entry, capacity float64, ttl, period time.Duration) Reservation {
	s := st.svc
	r := Reservation{Key: sb.pol.key, Sub: st.id, Host: st.host, Want: sb.demand, Cap: capacity, TTL: ttl, Stale: 2*period + loweredGrace, Grace: graceFor(period)}
	live := 1
	var take *Entry
	for i := range entries {
		e := &entries[i]
		switch {
		case e.Sub == st.id:
		case !e.Gone:
			live++
		case sb.fresh && e.Host == st.host && st.host != "" && (take == nil || e.Rate > take.Rate):
			take = e // the same Envoy, reconnected: it takes its share over
		}
	}
	fill := pickFill(sb.pol.rate, live, sb.fill)
	r.Fill = fill
	// A subscriber whose demand is not measured yet claims a floor, a
	// quarter of an equal share: enough to start with, and it leaves room
	// for the others that arrive at the same time; its first reports
	// measure what it wants.
	floor := capacity / float64(4*live)
	gone := 0.0
	claims := make([]claim, 0, live)
	for i := range entries {
		e := &entries[i]
		switch {
		case e.Sub == st.id || e == take:
		case e.Gone:
			gone += e.Rate
		default:
			claims = append(claims, claim{want: wantTokens(e.Want, floor, fill), held: int64(math.Round(e.Rate * float64(fill))), tie: tieOf(e.Sub)})
		}
	}
	want, held := sb.demand, heldTokens(sb, fill)
	if take != nil {
		r.Takeover = take.Sub
		if want < 0 {
			want = take.Want
		}
		held = int64(math.Round(take.Rate * float64(fill)))
	}
	me := len(claims)
	claims = append(claims, claim{want: wantTokens(want, floor, fill), held: held, tie: tieOf(st.id)})
	total := int64(math.Floor(max(capacity-gone, 0)*float64(fill) + 1e-9))
	target := waterfill(total, claims, nil)[me]

	// Hysteresis: changes within the dead band are not made; a raise
	// waits for the Hysteresis-th report in a row that asks for one. A
	// subscription (or takeover) is answered at once.
	// A takeover keeps the share it takes over when that is close enough,
	// so that Envoy keeps its token bucket.
	band := max(1, held/20)
	switch {
	case sb.fresh && take == nil:
		sb.raise = 0
	case target > held:
		if target-held <= band {
			target = held
			break
		}
		if take != nil {
			break
		}
		sb.raise++
		if s.o.Hysteresis > 0 && sb.raise < s.o.Hysteresis {
			target = held
		} else {
			sb.raise = 0
		}
	default:
		sb.raise = 0
		if held-target <= band && target > 0 {
			target = held
		}
	}
	r.Target = float64(target) / float64(fill)
	return r
}

// heldTokens returns what a sub holds in tokens per fill seconds.
func heldTokens(sb *sub, fill int64) int64 {
	if sb.fill == fill {
		return sb.held
	}
	return int64(math.Round(sb.rate() * float64(fill)))
}

// wantTokens returns a claim's want in tokens per fill: headroom over its
// demand, or the floor while its demand is not known; at least one token.
func wantTokens(want, floor float64, fill int64) int64 {
	w := floor
	if want >= 0 {
		w = want * headroom
	}
	t := math.Ceil(w*float64(fill) - 1e-9)
	if !(t >= 1) {
		return 1
	}
	return int64(min(t, math.MaxInt64/4))
}

var tieSeed = maphash.MakeSeed()

func tieOf(sub string) uint64 { return maphash.String(tieSeed, sub) }

// assign records a grant and appends its action.
func (st *stream) assign(sb *sub, fill, tokens int64, ttl, period time.Duration, resp *rlqsv3.RateLimitQuotaResponse) {
	s := st.svc
	before, first := sb.rate(), sb.fresh
	sb.fill, sb.held, sb.ttl, sb.fresh, sb.shared = fill, tokens, ttl, false, true
	rate := sb.rate()
	switch {
	case first: // a subscription, not a change
	case rate > before:
		s.m.change("raise")
	case rate < before:
		s.m.change("lower")
	}
	s.aggSet(st, sb, rate)
	if tokens <= 0 {
		resp.BucketAction = append(resp.BucketAction, assignment(sb.id, closed, ttl))
		st.setLast(sb, closed)
		return
	}
	var burst float64
	switch sb.pol.kind {
	case budgetKind:
		burst = rate * period.Seconds()
	default:
		burst = sb.pol.burst * rate / sb.pol.rate
	}
	tb := tokenBucket(sb.last, fill, tokens, int64(math.Floor(burst+1e-9)))
	resp.BucketAction = append(resp.BucketAction, assignment(sb.id, tb, ttl))
	st.setLast(sb, tb)
}

// setLast records what was sent. A token bucket after none (or after a
// blanket rule) starts full at Envoy: its burst is charged to the ledger.
func (st *stream) setLast(sb *sub, s sent) {
	if s.tb && !sb.last.tb && sb.pol.kind == rateKind {
		st.svc.aggBurst(sb.pol.key, float64(s.burst))
	}
	sb.last = s
}

// drop forgets a sub (abandoned, or the stream ended).
func (st *stream) drop(ctx context.Context, sb *sub, abandon bool) {
	delete(st.subs, sb.key)
	st.svc.buckets.Add(-1)
	if sb.shared {
		st.release(ctx, []*sub{sb}, abandon)
	}
}

// release tells the Shares and the ledger that subs stopped. An abandoned
// sub (drop) gives its share up at once; Envoy forgets the bucket. Others
// (the stream ended) hold theirs until their TTL: Envoy keeps enforcing
// the last assignment that long.
func (st *stream) release(ctx context.Context, subs []*sub, drop bool) {
	s := st.svc
	rs := make([]Release, 0, len(subs))
	for _, sb := range subs {
		rs = append(rs, Release{Key: sb.pol.key, Sub: st.id, Drop: drop})
		until := s.now().Add(sb.ttl)
		if drop {
			until = s.now().Add(graceFor(st.reportPeriod()))
		}
		s.aggDepart(st, sb.pol.key, sb.rate(), until)
	}
	if err := s.shares.Release(ctx, rs); err != nil {
		s.m.sharesError()
		s.log.Warn("RLQS shares: releasing subscribers failed; their shares expire with their TTL", "error", err.Error(), "subscribers", len(rs))
	}
}

// close ends the stream: every bucket's share is held until its TTL, none
// is abandoned.
func (st *stream) close() {
	s := st.svc
	var subs []*sub
	for _, sb := range st.subs {
		if sb.shared {
			subs = append(subs, sb)
		}
	}
	if len(subs) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st.release(ctx, subs, false)
		cancel()
	}
	s.buckets.Add(-int64(len(st.subs)))
	st.subs = nil
	s.m.streamClosed()
}

// idSeed keys the buckets of a stream; it is chosen per process, so no
// client can make two of its ids share a key on purpose.
var idSeed = maphash.MakeSeed()

// idKey returns a 64-bit key of a bucket id: the same for the same map
// whatever its order.
func idKey(id *rlqsv3.BucketId) uint64 {
	kv := id.GetBucket()
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var h maphash.Hash
	h.SetSeed(idSeed)
	var n [8]byte
	for _, k := range keys {
		v := kv[k]
		binary.LittleEndian.PutUint32(n[:4], uint32(len(k)))
		binary.LittleEndian.PutUint32(n[4:], uint32(len(v)))
		h.Write(n[:])
		h.WriteString(k)
		h.WriteString(v)
	}
	return h.Sum64()
}

// sameID reports whether two bucket ids hold the same map.
func sameID(a, b *rlqsv3.BucketId) bool {
	x, y := a.GetBucket(), b.GetBucket()
	if len(x) != len(y) {
		return false
	}
	for k, v := range x {
		if w, ok := y[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// checkID returns why a bucket id is refused, or "".
func checkID(id *rlqsv3.BucketId) string {
	kv := id.GetBucket()
	if len(kv) > MaxBucketEntries {
		return strconv.Itoa(len(kv)) + " entries (at most " + strconv.Itoa(MaxBucketEntries) + ")"
	}
	n := 0
	for k, v := range kv {
		n += len(k) + len(v)
	}
	if n > MaxBucketIDBytes {
		return strconv.Itoa(n) + " bytes (at most " + strconv.Itoa(MaxBucketIDBytes) + ")"
	}
	return ""
}
