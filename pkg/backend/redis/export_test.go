package redis

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Slot exposes slot to the tests.
var Slot = slot

// RedisKey exposes redisKey to the tests.
func RedisKey(prefix string, it backend.Item) string { return redisKey(prefix, &it) }

// ForceEval makes s call the script with EVALSHA/EVAL, as it does on a
// server without functions (Redis before 7.0).
func ForceEval(s *Store) { s.evalOnly.Store(true) }

// ProbeWarm reports whether a PING was answered on the probe connection of
// s's node (standalone or Sentinel): a stall's probe then needs no
// handshake.
func ProbeWarm(s *Store) bool { return s.health != nil && s.health.one.warmed.Load() }

// EndStuckReads runs on s what Close runs while it waits for the
// background calls of lease and approximate (see Store.waitCut).
func EndStuckReads(s *Store) { s.health.endStuckReads() }

// NewWithClock is New with the script's instant read from clock instead of
// Redis's TIME (see newStore).
func NewWithClock(opts Options, clock backend.Clock) (*Store, error) { return newStore(opts, clock) }

// StateNumbers decodes a string state as the script writes it (see
// script.go): its algorithm and its numbers (fixed window: at, count).
func StateNumbers(v string) (algorithms.Kind, []float64, error) {
	if len(v) != 17 && len(v) != 25 && len(v) != 33 || v[0] < stateMagic {
		return 0, nil, fmt.Errorf("not a state: %x", v)
	}
	var f []float64
	for at := 1; at < len(v); at += 8 {
		f = append(f, math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[at:at+8]))))
	}
	return algorithms.Kind(v[0] - stateMagic), f, nil
}

// LeaseDriver drives the reserves and returns of consistency lease on a
// store directly, without its refillers: a test decides what each batch
// carries (see leasePath.send).
type LeaseDriver struct {
	p *leasePath
	m map[string]*lease
}

// NewLeaseDriver returns a driver on s as instance id (a bucket's part in
// Redis is under it), with a refiller's defaults and s's clock.
func NewLeaseDriver(s *Store, id string) *LeaseDriver {
	_, timeout, clock := s.localBasics(Options{})
	p := &leasePath{r: s, id: id, horizon: float64(DefaultLeaseHorizon.Microseconds()), minChunk: DefaultLeaseMinChunk,
		idle: DefaultLeaseIdle.Microseconds(), hold: 2 * DefaultLeaseIdle.Microseconds(), maxKeys: DefaultLeaseKeys,
		clock: clock, m: map[string]*lease{}, work: make(chan leaseCall, 4096), stop: make(chan struct{}), timeout: timeout,
		perCall: leaseBatchKeys, plenty: plenty}
	return &LeaseDriver{p: p, m: map[string]*lease{}}
}

// LeaseOp is one key's part of a batch: a reserve of N hits, or (Return)
// the return of the key's whole chunk, as giveBack sends it.
type LeaseOp struct {
	Item   backend.Item
	N      uint64
	Return bool
}

func (d *LeaseDriver) entry(it *backend.Item) *lease {
	e := d.m[it.Key]
	if e == nil {
		e = &lease{key: redisKey(d.p.r.prefix, it), limit: it.Limit}
		d.m[it.Key] = e
	}
	return e
}

// Send sends ops as one batch, in one pipeline (oneByOne: one call of
// lease.lua per op, as before calls carried many keys).
func (d *LeaseDriver) Send(ctx context.Context, ops []LeaseOp, oneByOne bool) {
	now := d.p.now()
	calls := make([]leaseCall, 0, len(ops))
	for _, op := range ops {
		e := d.entry(&op.Item)
		e.mu.Lock()
		c := leaseCall{e: e, op: opReserve, n: op.N, limit: e.limit, gen: e.gen, sent: now}
		if op.Return {
			c = leaseCall{e: e, op: opReturn, n: e.avail, cs: e.start, limit: e.limit}
			e.avail, e.owned = 0, 0
			e.gen++
		} else {
			e.pending = true
		}
		c.used = e.owned - min(e.avail, e.owned)
		if !e.limit.Algorithm.HasBurst() {
			c.used = 0
		}
		e.mu.Unlock()
		calls = append(calls, c)
	}
	d.p.perCall = leaseBatchKeys
	if oneByOne {
		d.p.perCall = 1
	}
	d.p.send(ctx, calls)
}

// Take takes up to n hits of the key's chunk, as admissions do.
func (d *LeaseDriver) Take(it backend.Item, n uint64) {
	e := d.entry(&it)
	e.mu.Lock()
	e.avail -= min(n, e.avail)
	e.mu.Unlock()
}

// Chunk is what the driver holds of a key after the replies applied.
type Chunk struct {
	Avail, Owned, Left    uint64
	Start, Expires, Retry int64
	Pending               bool
}

// Chunk returns the key's chunk.
func (d *LeaseDriver) Chunk(it backend.Item) Chunk {
	e := d.entry(&it)
	e.mu.Lock()
	defer e.mu.Unlock()
	return Chunk{Avail: e.avail, Owned: e.owned, Left: e.left, Start: e.start, Expires: e.expires, Retry: e.retry, Pending: e.pending}
}

// Stats returns the driver's lease counters.
func (d *LeaseDriver) Stats() LeaseStats { return d.p.stats() }

// LeaseBatchKeys exposes leaseBatchKeys to the tests.
const LeaseBatchKeys = leaseBatchKeys

// SetLeasePlenty sets s's plenty factor of consistency lease (what remains
// must be f × instances × a chunk for plenty): a test lowers it so that
// approximate keys take chunks under small limits.
func SetLeasePlenty(s *Store, f uint64) { s.lease.(*leasePath).plenty = f }
