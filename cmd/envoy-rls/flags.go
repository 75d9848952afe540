package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/envoyrls/envoy-rls/internal/refenv"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

var errHelp = errors.New("help requested")

// options is every setting of `serve`, parsed once here and passed down.
type options struct {
	Source    sourceOptions
	GRPCTLS   grpcTLSOptions
	Obs       observabilityOptions
	Decisions decisionOptions
	Response  responseOptions
	Listen    listenerOptions

	// Backend is --backend, settled by validate; BackendFrom names what
	// selected it.
	Backend     backendKind
	BackendFrom string
	Memory      memoryOptions
	Failure     failureOptions

	Redis redisOptions
	RLQS  rlqsOptions

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

// serveTopics are the topics of serve's help, in this order: the everyday
// ones first.
var serveTopics = []string{"Config source", "Listeners", "Store", "Redis", "Failure policy", "Decisions", "Responses",
	"Observability", "gRPC TLS", "xDS client", "Per-second Redis", "Connection bounds", "RLQS", "Deprecated"}

// parseServe parses serve's flags and environment. On -h it writes the
// usage to out and returns errHelp.
func parseServe(args []string, out io.Writer) (options, error) {
	var o options
	c := newCommand("serve", serveSynopsis, true)
	o.cmd = c
	for _, t := range serveTopics {
		c.section(t)
	}
	fs := c.fs
	o.Source.addFlags(c.section("Config source"))
	o.Listen.addFlags(c.section("Listeners"), c.section("Connection bounds"))
	c.section("Store").TextVar(&o.Backend, "backend", backendKind(""), "memory (embedded, bounded) or redis; default: redis when --redis-url, --redis-sentinel or --redis-cluster is given, else memory")
	o.Memory.addFlags(c.section("Store"))
	o.Redis.addFlags(c.section("Redis"), c.section("Per-second Redis"), c.section("Deprecated"))
	o.Failure.addFlags(c.section("Failure policy"))
	o.RLQS.addFlags(c.section("RLQS"))
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

// warnings lists what serve warns of at start: the ENVOY_RLS_* variables
// of environ that name no flag, and the deprecated flags given (not those
// the reference's environment set, which stays a supported surface).
func (o options) warnings(environ []string) []string {
	fromReference := func(name string) bool {
		if o.reference == nil {
			return false
		}
		_, ok := o.reference.Lookup(name)
		return ok
	}
	return append(o.cmd.unknownEnv(environ), o.cmd.deprecatedUse(fromReference)...)
}

// validate checks the options together.
func (o *options) validate() error {
	var errs []error
	errs = append(errs, o.Source.validate()...)
	errs = append(errs, o.GRPCTLS.validate()...)
	errs = append(errs, o.Listen.validate(o.cmd)...)
	if o.Source.Load.RLQS {
		errs = append(errs, o.RLQS.validate(o.cmd, o.Listen)...)
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
		o.Redis.settle(o.cmd.given)
		errs = append(errs, o.Redis.validate(o.cmd)...)
	}
	return errors.Join(errs...)
}

// checkOptions are check-config's: the config path and how to read it,
// and, when the reference server's environment named them (no --config),
// the variables that did.
type checkOptions struct {
	path string
	lo   loadOptions
	from string // "" unless the reference's environment chose the path
}

// checkFlags are the flags of check-config that the reference's
// environment can set (those of serve with the same names).
var checkFlags = []string{"config", "config-recursive", "config-all-files", "config-dotfiles", "merge-domain-config", "config-lenient", "rlqs"}

// parseCheck parses check-config's flags. On -h it writes the usage to out
// and returns errHelp. Without --config, it reads the config where serve
// would: where the reference server's environment says, selecting its
// files as serve then does.
func parseCheck(args []string, out io.Writer) (checkOptions, error) {
	var co checkOptions
	c := newCommand("check-config", "  envoy-rls check-config --config PATH [--config-recursive] [--config-all-files] [--config-dotfiles] [--merge-domain-config] [--config-lenient] [--rlqs]\n  envoy-rls check-config   (no --config: where the reference server's environment says, as serve reads it)\n\nLoads the config as serve would and prints every file of a directory it skips and why, then every error as file:line: reason (exit 1), or that it is valid (exit 0); with --config-lenient, what was accepted as the reference server accepts it as file:line: warning: reason.", true)
	fs := c.section("Flags")
	fs.StringVar(&co.path, "config", "", "descriptor config: a YAML file or a directory of them (default: where the reference server's environment says, as serve reads it)")
	co.lo.addFlags(fs)
	if err := c.parse(args); err != nil {
		if errors.Is(err, errHelp) {
			c.usage(out)
		}
		return co, err
	}
	if co.path != "" {
		return co, nil
	}
	res, err := refenv.Translate(lookupEnv)
	if err != nil {
		return co, fmt.Errorf("no --config: reading the reference server's environment (envoyproxy/ratelimit), as serve does:\n%v", err)
	}
	if x, ok := res.Lookup("config-xds"); ok {
		return co, fmt.Errorf("no --config, and the reference server's environment takes the config over xDS (%s: %s): nothing to check; give --config PATH", x.From, x.Value)
	}
	var errs []error
	for _, name := range checkFlags {
		st, ok := res.Lookup(name)
		if !ok || c.given(name) {
			continue
		}
		if err := c.fs.Set(name, st.Value); err != nil {
			errs = append(errs, fmt.Errorf("%s: --%s=%q: %v", st.From, name, st.Value, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return co, err
	}
	if co.path == "" {
		return co, errors.New("--config is required: a YAML file or a directory of them (or set ENVOY_RLS_CONFIG)")
	}
	st, _ := res.Lookup("config")
	co.from = st.From
	return co, nil
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
