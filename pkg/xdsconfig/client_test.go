package xdsconfig_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/internal/xdstest"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/xdsconfig"
)

// egConfig is a RateLimitConfig shaped like Envoy Gateway's: the domain is
// a policy's namespace/name, and one rule is a nested chain with the limit
// on the leaf.
func egConfig(domain string, requests uint32) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{
		Name:   domain,
		Domain: domain,
		Descriptors: []*rlsconf.RateLimitDescriptor{{
			Key:   "default/policy/rule/0",
			Value: "default/policy/rule/0",
			Descriptors: []*rlsconf.RateLimitDescriptor{{
				Key: "rule-0-match-0",
				Descriptors: []*rlsconf.RateLimitDescriptor{{
					Key:   "masked_remote_address",
					Value: "0.0.0.0/0",
					Descriptors: []*rlsconf.RateLimitDescriptor{{
						Key:       "remote_address",
						RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: requests},
					}},
				}},
			}},
		}},
	}
}

var egChain = []descriptors.Entry{
	{Key: "default/policy/rule/0", Value: "default/policy/rule/0"},
	{Key: "rule-0-match-0", Value: "x-user-a"},
	{Key: "masked_remote_address", Value: "0.0.0.0/0"},
	{Key: "remote_address", Value: "10.1.2.3"},
}

// limitOf returns the requests per unit the chain gets in domain under cfg,
// or -1 when nothing matches.
func limitOf(cfg *descriptors.Config, domain string) int {
	path := cfg.Domain(domain).Match(egChain, nil)
	if len(path) != len(egChain) || len(path[len(path)-1].Limits) != 1 {
		return -1
	}
	return int(path[len(path)-1].Limits[0].RequestsPerUnit)
}

type applied struct {
	mu    sync.Mutex
	cfgs  []*descriptors.Config
	loads []error
}

func (a *applied) last() *descriptors.Config {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cfgs) == 0 {
		return nil
	}
	return a.cfgs[len(a.cfgs)-1]
}

func (a *applied) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.cfgs)
}

func (a *applied) waitCount(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for a.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d configs applied within 30s, want %d", a.count(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func startClient(t *testing.T, cp *xdstest.ControlPlane, files redistest.TLSFiles, a *applied, meta *structpb.Struct) *xdsconfig.Client {
	t.Helper()
	tlsConf := files.ClientConfig(t)
	tlsConf.ServerName = "localhost"
	c, err := xdsconfig.New(xdsconfig.Options{
		Addr:         cp.Addr,
		NodeID:       xdstest.NodeID,
		NodeMetadata: meta,
		TLS:          tlsConf,
		Backoff:      xdsconfig.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, RandomFactor: 0.5, Jitter: true},
		Apply: func(c *descriptors.Config) {
			a.mu.Lock()
			a.cfgs = append(a.cfgs, c)
			a.mu.Unlock()
		},
		Loaded: func(err error) {
			a.mu.Lock()
			a.loads = append(a.loads, err)
			a.mu.Unlock()
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func TestClientFollowsSnapshotsOverMutualTLS(t *testing.T) {
	files := redistest.NewTLSFiles(t)
	cp := xdstest.Start(t, xdstest.ServerTLS(t, files.ServerCert, files.ServerKey, files.CA))
	const domain = "default/eg-policy"
	v1 := cp.Set(t, egConfig(domain, 3))

	meta, _ := structpb.NewStruct(map[string]any{"cluster": "envoy-gateway-system"})
	var a applied
	c := startClient(t, cp, files, &a, meta)
	select {
	case <-c.FirstConfig():
	case <-time.After(30 * time.Second):
		t.Fatal("no config within 30s")
	}
	if got := limitOf(a.last(), domain); got != 3 {
		t.Fatalf("limit of the chain = %d, want 3", got)
	}
	ack := cp.WaitRequest(t, "ACK of version "+v1, xdstest.ACKed(v1))
	if ack.GetNode().GetId() != xdstest.NodeID || ack.GetNode().GetMetadata().GetFields()["cluster"].GetStringValue() != "envoy-gateway-system" {
		t.Fatalf("node = %v, want id %s with the metadata", ack.GetNode(), xdstest.NodeID)
	}
	if ack.GetTypeUrl() != xdsconfig.TypeURL {
		t.Fatalf("type = %q", ack.GetTypeUrl())
	}

	// An update replaces the whole config.
	v2 := cp.Set(t, egConfig(domain, 7), egConfig("other/policy", 1))
	a.waitCount(t, 2)
	if got := limitOf(a.last(), domain); got != 7 {
		t.Fatalf("after update: limit = %d, want 7", got)
	}
	if got := limitOf(a.last(), "other/policy"); got != 1 {
		t.Fatalf("after update: other domain limit = %d, want 1", got)
	}
	cp.WaitRequest(t, "ACK of version "+v2, xdstest.ACKed(v2))

	// An invalid config is NACKed with the reason; nothing is applied.
	bad := egConfig(domain, 9)
	bad.Descriptors[0].Descriptors[0].Descriptors[0].Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	cp.Set(t, bad)
	nack := cp.WaitRequest(t, "NACK", xdstest.NACKed)
	if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, "needs a unit") || !strings.Contains(msg, "xds:"+domain) {
		t.Fatalf("NACK message %q does not name the resource and the reason", msg)
	}
	if nack.GetVersionInfo() != v2 {
		t.Fatalf("NACK carries version %q, want the last good %q", nack.GetVersionInfo(), v2)
	}
	if a.count() != 2 {
		t.Fatalf("%d configs applied after the NACK, want still 2", a.count())
	}
	if v, reason := c.Version(); v != v2 || reason == "" {
		t.Fatalf("Version() = %q, %q; want %q and a reason", v, reason, v2)
	}

	// The control plane goes away: the config stays; it comes back with a
	// new snapshot, which applies.
	cp.Stop()
	if got := limitOf(a.last(), domain); got != 7 {
		t.Fatalf("control plane down: limit = %d, want 7", got)
	}
	v4 := cp.Set(t, egConfig(domain, 11))
	cp.Restart(t)
	a.waitCount(t, 3)
	if got := limitOf(a.last(), domain); got != 11 {
		t.Fatalf("after restart: limit = %d, want 11", got)
	}
	cp.WaitRequest(t, "ACK of version "+v4, xdstest.ACKed(v4))

	// An empty state of the world is a valid, empty config.
	cp.Set(t)
	a.waitCount(t, 4)
	if n := len(a.last().Domains()); n != 0 {
		t.Fatalf("empty snapshot: %d domains, want 0", n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var nacks int
	for _, err := range a.loads {
		if err != nil {
			nacks++
		}
	}
	if nacks != 1 || len(a.loads) != 5 {
		t.Fatalf("Loaded saw %d outcomes with %d errors, want 5 with 1", len(a.loads), nacks)
	}
}

// A client without a certificate is refused by a control plane that
// requires one, and never gets a config.
func TestClientWithoutCertificateGetsNothing(t *testing.T) {
	files := redistest.NewTLSFiles(t)
	cp := xdstest.Start(t, xdstest.ServerTLS(t, files.ServerCert, files.ServerKey, files.CA))
	cp.Set(t, egConfig("d", 1))
	tlsConf := files.ClientConfig(t)
	tlsConf.Certificates = nil
	var attempts atomic.Int32
	errs := make(chan error, 16)
	c, err := xdsconfig.New(xdsconfig.Options{
		Addr: cp.Addr, NodeID: xdstest.NodeID, TLS: tlsConf,
		Backoff: xdsconfig.Backoff{Initial: 5 * time.Millisecond, Max: 10 * time.Millisecond},
		Apply:   func(*descriptors.Config) { t.Error("a config was applied without a client certificate") },
		Logger: slog.New(handlerFunc(func(r slog.Record) {
			r.Attrs(func(at slog.Attr) bool {
				if at.Key == "error" {
					if e, ok := at.Value.Any().(error); ok {
						attempts.Add(1)
						select {
						case errs <- e:
						default:
						}
					}
				}
				return true
			})
		})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for attempts.Load() < 3 {
		time.Sleep(5 * time.Millisecond)
	}
	if c.HasConfig() {
		t.Fatal("HasConfig after refused connections")
	}
	if e := <-errs; e == nil || errors.Is(e, context.Canceled) {
		t.Fatalf("stream error %v, want a handshake failure", e)
	}
	for _, r := range cp.Requests() {
		t.Fatalf("the control plane received a request: %v", r)
	}

}

type handlerFunc func(slog.Record)

func (h handlerFunc) Enabled(context.Context, slog.Level) bool      { return true }
func (h handlerFunc) Handle(_ context.Context, r slog.Record) error { h(r); return nil }
func (h handlerFunc) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h handlerFunc) WithGroup(string) slog.Handler                 { return h }

// The log says what serves while the control plane fails or refuses: no
// config before the first one arrived, the last good one after.
func TestClientLogSaysWhetherAConfigServes(t *testing.T) {
	files := redistest.NewTLSFiles(t)
	cp := xdstest.Start(t, xdstest.ServerTLS(t, files.ServerCert, files.ServerKey, files.CA))
	const domain = "default/eg-policy"
	bad := egConfig(domain, 9)
	bad.Descriptors[0].Descriptors[0].Descriptors[0].Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	cp.Set(t, bad)
	var out testutil.SyncBuffer
	tlsConf := files.ClientConfig(t)
	tlsConf.ServerName = "localhost"
	var a applied
	c, err := xdsconfig.New(xdsconfig.Options{
		Addr: cp.Addr, NodeID: xdstest.NodeID, TLS: tlsConf,
		Backoff: xdsconfig.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		Apply: func(c *descriptors.Config) {
			a.mu.Lock()
			a.cfgs = append(a.cfgs, c)
			a.mu.Unlock()
		},
		Logger: slog.New(slog.NewTextHandler(&out, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	const none = "no config was received yet"
	line := func(msg string) string {
		t.Helper()
		var found string
		testutil.WaitFor(t, 30*time.Second, msg+" logged", func() bool {
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.Contains(l, msg) {
					found = l
					return true
				}
			}
			return false
		})
		return found
	}
	if l := line("xDS config refused (NACK)"); !strings.Contains(l, none) || strings.Contains(l, "keeps serving") {
		t.Errorf("NACK before any config: %s", l)
	}
	cp.Stop()
	if l := line("xDS stream to the control plane ended"); !strings.Contains(l, none) || strings.Contains(l, "keeps serving") {
		t.Errorf("stream ended before any config: %s", l)
	}
	cp.Restart(t)
	cp.Set(t, egConfig(domain, 3))
	select {
	case <-c.FirstConfig():
	case <-time.After(30 * time.Second):
		t.Fatal("no config applied within 30s")
	}
	before := len(out.String())
	cp.Stop()
	testutil.WaitFor(t, 30*time.Second, "stream end logged after a config", func() bool {
		return strings.Contains(out.String()[before:], "xDS stream to the control plane ended")
	})
	if l := out.String()[before:]; !strings.Contains(l, "the last good config keeps serving") || strings.Contains(l, none) {
		t.Errorf("stream ended after a config: %s", l)
	}
}
