package integration

import (
	"context"
	"crypto/tls"
	bin "encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/internal/xdstest"
)

// Token budgets as Envoy Gateway renders a BackendTrafficPolicy rule with
// cost.response (Envoy AI Gateway's usage-based rate limiting): per route,
// a chain route -> rule-0-match-0 (x-user-id, Distinct) -> rule-0-match-1
// (x-ai-eg-model, Distinct) with the limit on the leaf. Envoy makes two
// calls per request on it: a check with the descriptor's hits_addend 0
// (cost.request.number: 0) and, when the stream is done, the token count
// as the descriptor's hits_addend, whose answer it ignores.

const (
	budgetDomain = "default/envoy-ai-gateway/http" // the listener's name
	budgetLimit  = 50_000                          // tokens per day (times the day in µs stays below 2^53: exact)
	budgetUser   = "alice"
	budgetModel  = "gpt-4o-mini"
	minCost      = 500
	maxCost      = 4000
	budgetCalls  = 12 // concurrent clients, 4 per instance
)

// budgetRoute is the route descriptor of the HTTPRoute rule the budget of
// an algorithm is on (one route per algorithm, so each has its own counter).
func budgetRoute(alg string) string { return "httproute/default/llm-" + alg + "/rule/0/match/0/*" }

// budgetChain is the descriptor chain Envoy Gateway renders for the rule.
func budgetChain(alg string, limit uint32) *rlsconf.RateLimitDescriptor {
	r := budgetRoute(alg)
	return &rlsconf.RateLimitDescriptor{Key: r, Value: r, Descriptors: []*rlsconf.RateLimitDescriptor{{
		Key: "rule-0-match-0",
		Descriptors: []*rlsconf.RateLimitDescriptor{{
			Key:       "rule-0-match-1",
			RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_DAY, RequestsPerUnit: limit},
		}},
	}}}
}

// budgetFileYAML is the same chain as a file, one route per algorithm, the
// algorithm on the leaf.
func budgetFileYAML(algs []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", budgetDomain)
	for _, alg := range algs {
		fmt.Fprintf(&b, "  - key: %q\n    value: %q\n    descriptors:\n      - key: rule-0-match-0\n        descriptors:\n          - key: rule-0-match-1\n            rate_limit: {unit: day, requests_per_unit: %d, algorithm: %s}\n",
			budgetRoute(alg), budgetRoute(alg), budgetLimit, alg)
	}
	return b.String()
}

// budgetRequest is the request Envoy sends for the rule, with hits as the
// descriptor's hits_addend.
func budgetRequest(alg string, hits uint64) *rlsv3.RateLimitRequest {
	return budgetRequestOf(alg, budgetUser, hits)
}

// budgetRequestOf is budgetRequest for another user.
func budgetRequestOf(alg, user string, hits uint64) *rlsv3.RateLimitRequest {
	r := budgetRoute(alg)
	return &rlsv3.RateLimitRequest{Domain: budgetDomain, Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{
			{Key: r, Value: r}, {Key: "rule-0-match-0", Value: user}, {Key: "rule-0-match-1", Value: budgetModel},
		},
		HitsAddend: wrapperspb.UInt64(hits),
	}}}
}

// spent is what a budget run charged.
type spent struct {
	sum, max uint64 // every charge made after a check that passed
	charges  int
}

// spendBudget runs Envoy's two calls per request from budgetCalls clients
// spread over the instances, each until its check is denied: the check,
// then, when it passes, the charge of a random cost in [minCost, maxCost].
func spendBudget(t *testing.T, clients []rlsv3.RateLimitServiceClient, alg string, seed uint64) spent {
	t.Helper()
	ctx := ctxT(t)
	var (
		mu  sync.Mutex
		out spent
		wg  sync.WaitGroup
	)
	for c := 0; c < budgetCalls; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			rls := clients[c%len(clients)]
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			for i := 0; i < 4*budgetLimit/minCost; i++ {
				r, err := rls.ShouldRateLimit(ctx, budgetRequest(alg, 0))
				if err != nil {
					t.Errorf("client %d: check: %v", c, err)
					return
				}
				if r.OverallCode != rlsv3.RateLimitResponse_OK {
					return
				}
				cost := minCost + rng.Uint64N(maxCost-minCost+1)
				if _, err := rls.ShouldRateLimit(ctx, budgetRequest(alg, cost)); err != nil {
					t.Errorf("client %d: charge: %v", c, err)
					return
				}
				mu.Lock()
				out.sum += cost
				out.max = max(out.max, cost)
				out.charges++
				mu.Unlock()
			}
			t.Errorf("client %d: %d requests and the budget still admits", c, 4*budgetLimit/minCost)
		}(c)
	}
	wg.Wait()
	return out
}

// redisState is a counter's state as the script stores it (see
// pkg/backend/redis/script.go): its algorithm and numbers (fixed window:
// at, count; sliding counter: at, count, prev; token bucket and gcra: at,
// level in token·µs; sliding log's header: at, count, last).
type redisState struct {
	alg  string
	nums []float64
}

var algByMagic = map[byte]string{240: "fixed_window", 241: "token_bucket", 242: "sliding_window_log", 243: "sliding_window_counter", 244: "gcra"}

// readCounter returns the state of the one key of rdb (standalone or
// Cluster) whose name holds route.
func readCounter(t *testing.T, rdb goredis.UniversalClient, route string) redisState {
	t.Helper()
	ctx := ctxT(t)
	var keys []string
	var mu sync.Mutex
	collect := func(ctx context.Context, c *goredis.Client) error {
		ks, err := c.Keys(ctx, "*").Result()
		mu.Lock()
		keys = append(keys, ks...)
		mu.Unlock()
		return err
	}
	var err error
	if cc, ok := rdb.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, collect)
	} else {
		err = collect(ctx, rdb.(*goredis.Client))
	}
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, k := range keys {
		if strings.Contains(k, route) {
			found = append(found, k)
		}
	}
	if len(found) != 1 {
		t.Fatalf("keys holding %q: %q, want one", route, found)
	}
	var v string
	if typ := rdb.Type(ctx, found[0]).Val(); typ == "list" {
		v = rdb.LIndex(ctx, found[0], 0).Val()
	} else {
		v = rdb.Get(ctx, found[0]).Val()
	}
	if len(v) < 17 || (len(v)-1)%8 != 0 || algByMagic[v[0]] == "" {
		t.Fatalf("key %q holds %x, not a state", found[0], v)
	}
	st := redisState{alg: algByMagic[v[0]]}
	for i := 1; i < len(v); i += 8 {
		st.nums = append(st.nums, math.Float64frombits(bin.LittleEndian.Uint64([]byte(v[i:i+8]))))
	}
	if pttl := rdb.PTTL(ctx, found[0]).Val(); pttl <= 0 {
		t.Fatalf("key %q has PTTL %v", found[0], pttl)
	}
	return st
}

// redisNow is Redis's clock (the script's TIME) in µs.
func redisNow(t *testing.T, rdb goredis.UniversalClient) int64 {
	t.Helper()
	tm, err := rdb.Time(ctxT(t)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

const dayMicros = 24 * 3600 * 1_000_000

// checkBudget spends alg's budget and checks what the bound says:
// every charge counted (the shared counter, or the debt, equals the charges
// made; the sliding log records charges while it has room), admitted usage
// at least the budget and at most the budget plus one charge per client in
// flight (plus the refill for token_bucket and gcra), and the check after
// exhaustion denied with duration_until_reset saying when it passes again
// (and, given headers, the RateLimit field saying the same).
func checkBudget(t *testing.T, clients []rlsv3.RateLimitServiceClient, rdb goredis.UniversalClient, alg string, headers bool) {
	t.Helper()
	start := redisNow(t, rdb)
	got := spendBudget(t, clients, alg, uint64(len(alg)))
	if t.Failed() {
		return
	}
	inFlight := uint64(budgetCalls) * got.max
	st := readCounter(t, rdb, budgetRoute(alg))
	if st.alg != alg {
		t.Fatalf("%s: the counter is %s", alg, st.alg)
	}
	before := redisNow(t, rdb)
	r, err := clients[0].ShouldRateLimit(ctxT(t), budgetRequest(alg, 0))
	after := redisNow(t, rdb)
	if err != nil {
		t.Fatal(err)
	}
	status := r.Statuses[0]
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || status.LimitRemaining != 0 {
		t.Fatalf("%s: check after the budget was spent: %v", alg, r)
	}
	wait := status.DurationUntilReset.AsDuration().Microseconds()
	// The wait passes between the Redis readings around the check:
	// [lo, hi] for the instant before, [lo2, hi2] after.
	inWindow := func(lo, hi int64) {
		t.Helper()
		if wait < lo-1 || wait > hi+1 {
			t.Errorf("%s: duration_until_reset %dµs, want in [%d, %d]", alg, wait, lo, hi)
		}
	}
	t.Logf("%s: %d charges, %d tokens admitted against %d (largest %d), state %v, duration_until_reset %v",
		alg, got.charges, got.sum, budgetLimit, got.max, st.nums, status.DurationUntilReset.AsDuration())
	switch alg {
	case "fixed_window", "sliding_window_counter":
		count := uint64(st.nums[1])
		if count != got.sum {
			t.Errorf("%s: the counter holds %d, the charges made %d", alg, count, got.sum)
		}
		if count < budgetLimit || count > budgetLimit-1+inFlight {
			t.Errorf("%s: %d admitted, want in [%d, %d]", alg, count, budgetLimit, budgetLimit-1+inFlight)
		}
		end := (before/dayMicros + 1) * dayMicros
		if alg == "fixed_window" {
			inWindow(end-after, end-before)
		} else if wait <= 0 || wait > 2*dayMicros {
			t.Errorf("%s: duration_until_reset %v", alg, status.DurationUntilReset.AsDuration())
		}
	case "token_bucket", "gcra":
		// level is the tokens missing from a full bucket times the window
		// at instant at; the bucket was full before the first charge and
		// refills at budgetLimit a day.
		at, level := int64(st.nums[0]), st.nums[1]
		missing := level / dayMicros
		refilled := float64(budgetLimit) * float64(at-start) / dayMicros
		if d := float64(got.sum) - missing; d < -1e-6 || d > refilled+1e-6 {
			t.Errorf("%s: the debt is %.3f tokens, the charges %d (refill since the start at most %.3f)", alg, missing, got.sum, refilled)
		}
		if float64(got.sum) > budgetLimit-1+refilled+float64(inFlight) || missing <= budgetLimit-1 {
			t.Errorf("%s: %d admitted, %.3f missing; want at most %.0f admitted and more than %d missing", alg, got.sum, missing, budgetLimit-1+refilled+float64(inFlight), budgetLimit-1)
		}
		// One token fits again when the debt has come down to capacity-1.
		retryAt := func(now int64) int64 {
			return int64(math.Ceil((level - float64(now-at)*budgetLimit + dayMicros - budgetLimit*dayMicros) / budgetLimit))
		}
		inWindow(retryAt(after), retryAt(before))
	case "sliding_window_log":
		count := uint64(st.nums[1])
		if count > got.sum || count < budgetLimit || count > budgetLimit-1+got.max {
			t.Errorf("sliding_window_log: the log holds %d of %d charged; want at least %d, at most %d (a full log saturates)", count, got.sum, budgetLimit, budgetLimit-1+got.max)
		}
		if got.sum > budgetLimit-1+inFlight {
			t.Errorf("sliding_window_log: %d admitted, want at most %d", got.sum, budgetLimit-1+inFlight)
		}
		if wait <= 0 || wait > dayMicros {
			t.Errorf("sliding_window_log: duration_until_reset %v", status.DurationUntilReset.AsDuration())
		}
	}
	if headers {
		secs := int64(math.Ceil(float64(wait) / 1e6))
		var field string
		for _, h := range r.ResponseHeadersToAdd {
			if h.Key == "RateLimit" {
				field = h.Value
			}
		}
		if m := regexp.MustCompile(`;r=0;t=(\d+)`).FindStringSubmatch(field); m == nil || m[1] != strconv.FormatInt(secs, 10) {
			t.Errorf("%s: RateLimit %q, want r=0 and t=%d (duration_until_reset %v)", alg, field, secs, status.DurationUntilReset.AsDuration())
		}
	}
}

// startEGInstance runs the binary as Envoy Gateway's Deployment (no
// arguments, Envoy Gateway's environment plus extra), its config from the
// control plane, and returns a client over Envoy's mutual TLS once the
// config has arrived.
func startEGInstance(t *testing.T, pki *egPKI, cp *xdstest.ControlPlane, redisURL string, extra ...string) rlsv3.RateLimitServiceClient {
	t.Helper()
	grpcPort, httpPort, debugPort, promPort := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	p := &proc{grpcAddr: fmt.Sprintf("127.0.0.1:%d", grpcPort), httpURL: fmt.Sprintf("http://127.0.0.1:%d", httpPort), exited: make(chan struct{})}
	p.cmd = exec.Command(binary)
	p.cmd.Env = append(egEnvironment(pki, cp.Addr, redisURL, grpcPort, httpPort, debugPort, promPort), extra...)
	p.cmd.Dir = pki.dir
	startProc(t, p)
	envoyCert, err := tls.LoadX509KeyPair(pki.envoyCert, pki.envoyKey)
	if err != nil {
		t.Fatal(err)
	}
	envoyTLS := &tls.Config{RootCAs: pki.caPool, Certificates: []tls.Certificate{envoyCert}, ServerName: "envoy-ratelimit"}
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(envoyTLS)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	testutil.WaitEvery(t, procPoll, 60*time.Second, "the config over xDS", func() bool {
		r, err := client.ShouldRateLimit(ctxT(t), budgetRequest("fixed_window", 0))
		return err == nil && len(r.Statuses) == 1 && r.Statuses[0].CurrentLimit != nil
	})
	return client
}

// TestTokenBudgetOverXDS is Envoy AI Gateway's token budget as Envoy
// Gateway runs it: three instances started as its Deployment (the config
// over xDS, which cannot say usage_accounting, default flags) on one Redis
// and on a three-master Cluster, 12 clients making Envoy's two calls per
// request with costs of 500 to 4,000 tokens against 50,000 a day. Every
// charge is counted, though most of the last ones do not fit.
func TestTokenBudgetOverXDS(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	pki := newEGPKI(t)
	cp := xdstest.Start(t, xdstest.ServerTLS(t, pki.cpCert, pki.cpKey, pki.ca))
	cp.Set(t, &rlsconf.RateLimitConfig{Name: budgetDomain, Domain: budgetDomain,
		Descriptors: []*rlsconf.RateLimitDescriptor{budgetChain("fixed_window", budgetLimit)}})
	t.Run("redis", func(t *testing.T) {
		clearOfHourEnd(t)
		srv := redistest.StartStandalone(t)
		var clients []rlsv3.RateLimitServiceClient
		for i := 0; i < 3; i++ {
			clients = append(clients, startEGInstance(t, pki, cp, srv.Addr()))
		}
		checkBudget(t, clients, srv.Client(), "fixed_window", false)

		// ENVOY_RLS_USAGE_ACCOUNTING reaches the config over xDS under
		// Envoy Gateway's environment: with never, a cost that does not
		// fit is refused whole and counts nothing; with the default it
		// counts.
		never := startEGInstance(t, pki, cp, srv.Addr(), "ENVOY_RLS_USAGE_ACCOUNTING=never")
		code := func(c rlsv3.RateLimitServiceClient, user string, hits uint64) rlsv3.RateLimitResponse_Code {
			t.Helper()
			r, err := c.ShouldRateLimit(ctxT(t), budgetRequestOf("fixed_window", user, hits))
			if err != nil {
				t.Fatal(err)
			}
			return r.OverallCode
		}
		if code(never, "bob", budgetLimit+1) != rlsv3.RateLimitResponse_OVER_LIMIT || code(never, "bob", 0) != rlsv3.RateLimitResponse_OK {
			t.Fatalf("usage accounting never: a cost over the budget was counted")
		}
		if code(clients[0], "bob", budgetLimit+1) != rlsv3.RateLimitResponse_OVER_LIMIT || code(never, "bob", 0) != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("usage accounting auto: a cost over the budget was not counted")
		}
	})
	t.Run("cluster", func(t *testing.T) {
		clearOfHourEnd(t)
		cl := redistest.StartCluster(t, 3)
		var clients []rlsv3.RateLimitServiceClient
		for i := 0; i < 3; i++ {
			clients = append(clients, startEGInstance(t, pki, cp, strings.Join(cl.Addrs(), ","), "REDIS_TYPE=cluster"))
		}
		checkBudget(t, clients, cl.Client(t), "fixed_window", false)
	})
}

// TestTokenBudgetAlgorithms: the same chain from a file for the other four
// algorithms, three instances on one Redis and on a three-master Cluster,
// with the RateLimit header on.
func TestTokenBudgetAlgorithms(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	algs := []string{"token_bucket", "gcra", "sliding_window_counter", "sliding_window_log"}
	cfg := filepath.Join(t.TempDir(), "budget.yaml")
	writeFile(t, cfg, budgetFileYAML(algs))
	run := func(t *testing.T, rdb goredis.UniversalClient, redisArgs ...string) {
		clearOfHourEnd(t)
		procs := startInstances(t, 3, cfg, append(redisArgs, "--response-headers", "ietf")...)
		var clients []rlsv3.RateLimitServiceClient
		for _, p := range procs {
			clients = append(clients, p.client())
		}
		for _, alg := range algs {
			checkBudget(t, clients, rdb, alg, true)
		}
	}
	t.Run("redis", func(t *testing.T) {
		srv := redistest.StartStandalone(t)
		run(t, srv.Client(), "--redis-url", srv.URL())
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		run(t, cl.Client(t), "--redis-cluster", strings.Join(cl.Addrs(), ","))
	})
}
