package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/envoyrls/envoy-rls/internal/refenv"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

var errHelp = errors.New("help requested")

// options is every setting of `serve`, parsed once here and passed down.
type options struct {
	rlqsOptions
	Source    sourceOptions
	GRPCTLS   grpcTLSOptions
	Obs       observabilityOptions
	Decisions decisionOptions
	Response  responseOptions
	GRPCAddr  string
	HTTPAddr  string

	DebugAddr   string
	MetricsAddr string
	MetricsPath string

	// Backend is --backend, settled by validate; BackendFrom names what
	// selected it.
	Backend     backendKind
	BackendFrom string
	Memory      memoryOptions
	Failure     failureOptions

	KeyPrefix     string
	ShutdownGrace time.Duration

	GRPCMaxConcurrentStreams  int
	GRPCStreamWorkers         int
	GRPCMaxRecvMsgSize        byteSize
	GRPCMaxConnectionAge      time.Duration
	GRPCMaxConnectionAgeGrace time.Duration
	GRPCMaxConnections        int
	GRPCMaxConnectionIdle     time.Duration
	HTTPReadTimeout           time.Duration
	HTTPWriteTimeout          time.Duration
	HTTPIdleTimeout           time.Duration
	HTTPMaxConnections        int

	// redisConn is the main Redis (--redis-*); PerSecond the Redis of
	// the per-second counters (--redis-persecond-*), when it has a server.
	redisConn
	PerSecond      redisConn
	LocalDenyCache bool

	// cmd is the parsed command line, for messages naming where a value
	// came from.
	cmd *command
	// reference is the reference environment's translation when it was
	// read (no --config and no --config-xds given), else nil.
	reference *refenv.Result
}

// envName is the environment variable of a flag.
func envName(flagName string) string {
	return "ENVOY_RLS_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// serveSynopsis is the usage line of serve.
const serveSynopsis = "  envoy-rls serve --config PATH [flags]\n  envoy-rls serve --config-xds HOST:PORT [flags]\n  envoy-rls            (no arguments: the reference server's environment)"

// parseServe parses serve's flags and environment. On -h it writes the
// usage to out and returns errHelp.
func parseServe(args []string, out io.Writer) (options, error) {
	var o options
	c := newCommand("serve", serveSynopsis, true)
	o.cmd = c
	fs := c.fs
	o.Source.addFlags(c.section("Config source"))
	fs.StringVar(&o.GRPCAddr, "grpc-addr", ":8081", "gRPC listen address (RateLimitService, health, reflection)")
	fs.StringVar(&o.HTTPAddr, "http-addr", ":8080", "HTTP listen address (/healthz, /json, /metrics); empty disables it")
	fs.StringVar(&o.DebugAddr, "debug-addr", "", "debug listener: /rlconfig (the loaded limits), /debug/pprof/; empty disables it")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", "", "a separate Prometheus listener (as the reference's PROMETHEUS_ADDR); /metrics on --http-addr stays")
	fs.StringVar(&o.MetricsPath, "metrics-path", "/metrics", "path of the Prometheus metrics on --metrics-addr")
	c.section("Store").TextVar(&o.Backend, "backend", backendKind(""), "memory (embedded, bounded) or redis; default: redis when --redis-url, --redis-sentinel or --redis-cluster is given, else memory")
	o.Memory.addFlags(c.section("Store"))
	fs.StringVar(&o.KeyPrefix, "key-prefix", "", "prefix of every counter key (redis backend), to share one Redis between deployments")
	fs.DurationVar(&o.ShutdownGrace, "shutdown-grace", 5*time.Second, "longest wait for requests in flight on SIGTERM")
	fs.IntVar(&o.GRPCMaxConcurrentStreams, "grpc-max-concurrent-streams", defaultGRPCMaxConcurrentStreams, "most calls in progress on one gRPC connection; further streams are refused")
	fs.IntVar(&o.GRPCStreamWorkers, "grpc-stream-workers", defaultGRPCStreamWorkers, "goroutines that run gRPC calls one after another, sparing each call a new goroutine and the growth of its stack; a call finding all busy gets its own goroutine (0: a goroutine per call)")
	o.GRPCMaxRecvMsgSize = defaultGRPCMaxRecvMsgSize
	fs.TextVar(&o.GRPCMaxRecvMsgSize, "grpc-max-recv-msg-size", &o.GRPCMaxRecvMsgSize, "largest gRPC request accepted (larger ones get RESOURCE_EXHAUSTED), e.g. 64KiB; bounds request memory to about this times --grpc-max-concurrent-streams per connection")
	fs.DurationVar(&o.GRPCMaxConnectionAge, "grpc-max-connection-age", 24*time.Hour, "close a gRPC connection gracefully after this long (the reference's GRPC_MAX_CONNECTION_AGE)")
	fs.DurationVar(&o.GRPCMaxConnectionAgeGrace, "grpc-max-connection-age-grace", time.Hour, "calls in progress may finish this long after --grpc-max-connection-age (the reference's GRPC_MAX_CONNECTION_AGE_GRACE)")
	fs.IntVar(&o.GRPCMaxConnections, "grpc-max-connections", defaultGRPCMaxConnections, "most gRPC connections open at once; a connection beyond it is closed as soon as it is accepted")
	fs.DurationVar(&o.GRPCMaxConnectionIdle, "grpc-max-connection-idle", defaultGRPCMaxConnectionIdle, "close a gRPC connection gracefully (GOAWAY) after it has had no call in progress for this long; Envoy reconnects at its next call")
	fs.DurationVar(&o.HTTPReadTimeout, "http-read-timeout", 10*time.Second, "longest time to read an HTTP request, body included")
	fs.DurationVar(&o.HTTPWriteTimeout, "http-write-timeout", 10*time.Second, "longest time to handle an HTTP request and write its response")
	fs.DurationVar(&o.HTTPIdleTimeout, "http-idle-timeout", 60*time.Second, "close an idle HTTP keep-alive connection after this long")
	fs.IntVar(&o.HTTPMaxConnections, "http-max-connections", defaultHTTPMaxConnections, "most connections open at once on the HTTP listener (--http-addr); one beyond it is closed as soon as it is accepted")
	addRedisFlags(fs, &o.redisConn, "redis-")
	addRedisFlags(fs, &o.PerSecond, perSecondPrefix)
	fs.BoolVar(&o.LocalDenyCache, "local-deny-cache", true, "deny keys known to be over limit until their retry time without asking Redis")
	o.Failure.addFlags(c.section("Failure policy"))
	addRLQSFlags(fs, &o.rlqsOptions)
	o.Decisions.addFlags(c.section("Decisions"))
	o.Response.addFlags(c.section("Responses"))
	o.Obs.addFlags(c.section("Observability"))
	o.GRPCTLS.addFlags(c.section("gRPC TLS"))
	o.Source.XDS.addFlags(c.section("xDS client"))
	if err := c.parse(args); err != nil {
		if errors.Is(err, errHelp) {
			c.usage(out)
		}
		return o, err
	}
	if err := applyReference(fs, &o, lookupEnv); err != nil {
		return o, err
	}
	if err := o.Obs.readTracing(lookupEnv); err != nil {
		return o, err
	}
	err := o.validate() // settles o.Backend
	return o, err
}

// validate checks the options together.
func (o *options) validate() error {
	var errs []error
	errs = append(errs, o.Source.validate()...)
	errs = append(errs, o.GRPCTLS.validate()...)
	if !strings.HasPrefix(o.MetricsPath, "/") {
		errs = append(errs, errors.New("--metrics-path must start with /"))
	}
	errs = append(errs, o.validateRLQS()...)
	if o.GRPCAddr == "" {
		errs = append(errs, errors.New("--grpc-addr must not be empty"))
	}
	if o.GRPCMaxConcurrentStreams < 1 {
		errs = append(errs, errors.New("--grpc-max-concurrent-streams must be at least 1"))
	}
	if o.GRPCStreamWorkers < 0 || o.GRPCStreamWorkers > maxGRPCStreamWorkers {
		errs = append(errs, fmt.Errorf("--grpc-stream-workers must be 0 to %d", maxGRPCStreamWorkers))
	}
	if o.GRPCMaxConnections < 1 {
		errs = append(errs, errors.New("--grpc-max-connections must be at least 1"))
	}
	if o.HTTPMaxConnections < 1 {
		errs = append(errs, errors.New("--http-max-connections must be at least 1"))
	}
	if o.GRPCMaxRecvMsgSize < minGRPCMaxRecvMsgSize || o.GRPCMaxRecvMsgSize > maxGRPCMaxRecvMsgSize {
		errs = append(errs, fmt.Errorf("%s: want %s to %s", o.cmd.value("grpc-max-recv-msg-size", formatSize(uint64(o.GRPCMaxRecvMsgSize))), formatSize(minGRPCMaxRecvMsgSize), formatSize(maxGRPCMaxRecvMsgSize)))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"--grpc-max-connection-age", o.GRPCMaxConnectionAge},
		{"--grpc-max-connection-age-grace", o.GRPCMaxConnectionAgeGrace},
		{"--grpc-max-connection-idle", o.GRPCMaxConnectionIdle},
		{"--http-read-timeout", o.HTTPReadTimeout},
		{"--http-write-timeout", o.HTTPWriteTimeout},
		{"--http-idle-timeout", o.HTTPIdleTimeout},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", d.name))
		}
	}
	errs = append(errs, o.Response.validate()...)
	errs = append(errs, o.Obs.validate()...)
	errs = append(errs, o.Failure.validate(o.cmd)...)
	if err := o.selectBackend(); err != nil {
		return errors.Join(append(errs, err)...) // the rest depends on the backend
	}
	if o.Backend == "memory" || o.Failure.Mode == rls.FailLocal {
		errs = append(errs, o.Memory.validate(o.cmd)...)
	}
	switch o.Backend {
	case "redis":
		errs = append(errs, o.redisConn.validate()...)
		errs = append(errs, o.validatePerSecond()...)
	}
	return errors.Join(errs...)
}

// parseCheck parses check-config's flags. On -h it writes the usage to out
// and returns errHelp.
func parseCheck(args []string, out io.Writer) (string, loadOptions, error) {
	var (
		path string
		lo   loadOptions
	)
	c := newCommand("check-config", "  envoy-rls check-config --config PATH [--config-recursive] [--config-all-files] [--config-dotfiles] [--merge-domain-config] [--config-lenient] [--rlqs]\n\nLoads the config and prints every error as file:line: reason (exit 1), or that it is valid (exit 0); with --config-lenient, what was accepted as the reference server accepts it as file:line: warning: reason.", true)
	fs := c.section("Flags")
	fs.StringVar(&path, "config", "", "descriptor config: a YAML file or a directory of them (required)")
	lo.addFlags(fs)
	if err := c.parse(args); err != nil {
		if errors.Is(err, errHelp) {
			c.usage(out)
		}
		return "", lo, err
	}
	if path == "" {
		return "", lo, errors.New("--config is required: a YAML file or a directory of them (or set ENVOY_RLS_CONFIG)")
	}
	return path, lo, nil
}

// backendKind is --backend: memory or redis.
type backendKind string

func (k backendKind) MarshalText() ([]byte, error) { return []byte(k), nil }

func (k *backendKind) UnmarshalText(b []byte) error {
	switch v := backendKind(b); v {
	case "memory", "redis":
		*k = v
		return nil
	}
	return fmt.Errorf("want memory or redis")
}
