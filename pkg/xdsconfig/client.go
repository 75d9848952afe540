// Package xdsconfig receives the rate limit configuration over xDS: an
// aggregated (ADS), state-of-the-world client for
// type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig, the way
// Envoy Gateway serves it to the reference server.
//
// Every response is the whole configuration. It goes through the same
// parser and checks as YAML files (see Convert); a valid one is handed to
// Options.Apply and ACKed, an invalid one is NACKed with every error while
// the last good configuration keeps serving. When the stream or the
// connection fails, the client keeps the last configuration and reconnects
// with exponential backoff.
package xdsconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// Backoff is the reconnect schedule: the first wait is Initial, each next
// one doubles up to Max. RandomFactor (0 to 1) spreads each wait uniformly
// over [w*(1-f), w*(1+f)] when Jitter is on.
type Backoff struct {
	Initial      time.Duration
	Max          time.Duration
	RandomFactor float64
	Jitter       bool
}

// keepaliveTime is how long the connection to the control plane may be
// silent before the client pings it.
const keepaliveTime = 6 * time.Minute

// DefaultBackoff is the reference server's schedule.
var DefaultBackoff = Backoff{Initial: 10 * time.Second, Max: 60 * time.Second, RandomFactor: 0.5, Jitter: true}

// wait returns the wait before reconnect attempt n (0 for the first).
func (b Backoff) wait(n int) time.Duration {
	w := b.Initial
	if w <= 0 {
		w = time.Second
	}
	for i := 0; i < n && (b.Max <= 0 || w < b.Max); i++ {
		w *= 2
	}
	if b.Max > 0 && w > b.Max {
		w = b.Max
	}
	if b.Jitter && b.RandomFactor > 0 {
		f := min(b.RandomFactor, 1)
		w = time.Duration(float64(w) * (1 - f + 2*f*rand.Float64()))
	}
	return w
}

// Options configure a Client.
type Options struct {
	// Addr is the control plane's gRPC address, host:port.
	Addr string
	// NodeID and NodeMetadata identify this client to the control plane
	// (Envoy Gateway serves node id "envoy-ratelimit").
	NodeID       string
	NodeMetadata *structpb.Struct
	// TLS, when set, secures the connection (with client certificates for
	// mutual TLS); nil connects in plain text.
	TLS *tls.Config
	// Headers are added to the stream's gRPC metadata.
	Headers map[string]string
	// Backoff is the reconnect schedule (zero: DefaultBackoff).
	Backoff Backoff
	// MaxMessageSize bounds a received message in bytes (0: gRPC's 4 MiB).
	MaxMessageSize int
	// MergeDomains lets several resources define one domain (the
	// reference's MERGE_DOMAIN_CONFIG; see descriptors.Options).
	MergeDomains bool
	// Lenient accepts what the reference server accepts, with its meaning
	// (see descriptors.Options); each thing accepted that way is logged
	// as a warning when the config is applied. Resources cannot carry most
	// of what it concerns (a field twice, a field in the wrong place, a
	// missing count), so it rarely changes anything over xDS.
	Lenient bool
	// OrderFree refuses a config in which one RLQS quota bucket could
	// select two descriptors (see descriptors.Options).
	OrderFree bool
	// Apply receives every valid configuration, in order. It must not
	// block for long.
	Apply func(*descriptors.Config)
	// Loaded, when set, is told the outcome of every response: nil for an
	// applied config, the reason for a refused one.
	Loaded func(error)
	// Logger receives the client's log lines (nil: slog.Default()).
	Logger *slog.Logger
}

// Client is an ADS state-of-the-world client. Create it with New, run it
// with Run.
type Client struct {
	o    Options
	conn *grpc.ClientConn

	mu          sync.Mutex
	version     string // last ACKed version
	nacked      string // reason of the last NACK, or ""
	nackedVer   string // version of the last NACKed response
	haveConfig  atomic.Bool
	firstConfig chan struct{}
	firstOnce   sync.Once
}

// New checks the options and prepares the connection; nothing is sent
// before Run.
func New(o Options) (*Client, error) {
	if o.Addr == "" {
		return nil, errors.New("xds: no control plane address")
	}
	if o.Apply == nil {
		return nil, errors.New("xds: no Apply function")
	}
	if o.Backoff == (Backoff{}) {
		o.Backoff = DefaultBackoff
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS)
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// A control plane that vanished without closing the connection
		// (a partition, a dead node) is noticed by a ping, and the client
		// reconnects. gRPC servers refuse pings more often than every 5
		// minutes by default, so ping less often than that.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: 20 * time.Second}),
	}
	if o.MaxMessageSize > 0 {
		dopts = append(dopts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.MaxMessageSize)))
	}
	conn, err := grpc.NewClient(o.Addr, dopts...)
	if err != nil {
		return nil, fmt.Errorf("xds: %v", err)
	}
	return &Client{o: o, conn: conn, firstConfig: make(chan struct{})}, nil
}

// FirstConfig is closed when the first valid configuration was applied.
func (c *Client) FirstConfig() <-chan struct{} { return c.firstConfig }

// HasConfig reports whether a valid configuration was applied.
//
// Deprecated: nothing in this module calls it; FirstConfig is closed at the
// same moment.
func (c *Client) HasConfig() bool { return c.haveConfig.Load() }

// Version returns the version of the last applied configuration, and the
// reason of the last refused response ("" when the last one was applied).
func (c *Client) Version() (version, nacked string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version, c.nacked
}

// serving says what answers calls meanwhile, for the log: the last config
// applied, or none when none was yet.
func (c *Client) serving() string {
	if c.haveConfig.Load() {
		return "the last good config keeps serving"
	}
	return "no config was received yet: calls are answered without one (UNKNOWN) until a valid one arrives"
}

// Run keeps a stream to the control plane until ctx ends, reconnecting with
// backoff when it fails. It returns when ctx ends and closes the
// connection.
func (c *Client) Run(ctx context.Context) {
	defer c.conn.Close()
	failures := 0
	for ctx.Err() == nil {
		received, err := c.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if received {
			failures = 0
		}
		wait := c.o.Backoff.wait(failures)
		failures++
		c.o.Logger.Warn("xDS stream to the control plane ended; "+c.serving(),
			"server", c.o.Addr, "error", err, "retry_in", wait.Round(time.Millisecond))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// stream runs one ADS stream until it fails. It reports whether any
// response arrived on it.
func (c *Client) stream(ctx context.Context) (received bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.o.Headers) > 0 {
		kv := make([]string, 0, 2*len(c.o.Headers))
		for k, v := range c.o.Headers {
			kv = append(kv, k, v)
		}
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	s, err := discovery.NewAggregatedDiscoveryServiceClient(c.conn).StreamAggregatedResources(ctx, grpc.WaitForReady(false))
	if err != nil {
		return false, err
	}
	node := &core.Node{Id: c.o.NodeID, Metadata: c.o.NodeMetadata, UserAgentName: "envoy-rls"}
	// A new stream asks for everything (no version), so that a restarted
	// control plane always sends its state, which then replaces ours.
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: TypeURL}); err != nil {
		return false, err
	}
	for {
		resp, err := s.Recv()
		if err != nil {
			return received, err
		}
		if !received {
			received = true
			c.o.Logger.Info("xDS stream to the control plane established", "server", c.o.Addr, "node", c.o.NodeID)
		}
		req, repeat := c.handle(resp)
		req.Node = node
		if repeat {
			// go-control-plane answers a NACK with the same snapshot
			// again at once; pacing the repeated NACKs keeps that loop
			// from spinning both sides. A new snapshot is still picked
			// up by the next request.
			t := time.NewTimer(nackRepeatDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				return received, ctx.Err()
			case <-t.C:
			}
		}
		if err := s.Send(req); err != nil {
			return received, err
		}
	}
}

// nackRepeatDelay paces NACKs of a version that was already refused.
const nackRepeatDelay = time.Second

// handle validates and applies one response and returns its ACK or NACK,
// and whether it NACKs a version already refused before.
func (c *Client) handle(resp *discovery.DiscoveryResponse) (*discovery.DiscoveryRequest, bool) {
	var cfg *descriptors.Config
	err := fmt.Errorf("response has type %q, want %q", resp.GetTypeUrl(), TypeURL)
	if resp.GetTypeUrl() == TypeURL {
		cfg, err = ConvertWith(resp.GetResources(), descriptors.Options{MergeDomains: c.o.MergeDomains, Lenient: c.o.Lenient, OrderFree: c.o.OrderFree})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	req := &discovery.DiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
	if err != nil {
		req.VersionInfo = c.version
		req.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
		if c.nacked != "" && c.nackedVer == resp.GetVersionInfo() {
			return req, true // reported already
		}
		c.nacked, c.nackedVer = err.Error(), resp.GetVersionInfo()
		c.o.Logger.Error("xDS config refused (NACK); "+c.serving(),
			"version", resp.GetVersionInfo(), "errors", err.Error())
		if c.o.Loaded != nil {
			c.o.Loaded(err)
		}
		return req, false
	}
	c.o.Apply(cfg)
	c.version, c.nacked, c.nackedVer = resp.GetVersionInfo(), "", ""
	req.VersionInfo = c.version
	c.haveConfig.Store(true)
	c.firstOnce.Do(func() { close(c.firstConfig) })
	c.o.Logger.Info("xDS config applied", "version", c.version, "domains", len(cfg.Domains()))
	for _, w := range cfg.Warnings() {
		c.o.Logger.Warn("config accepted as the reference does: "+w.Error(), "version", c.version)
	}
	if c.o.Loaded != nil {
		c.o.Loaded(nil)
	}
	return req, false
}
