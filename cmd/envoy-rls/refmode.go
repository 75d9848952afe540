package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"github.com/envoyrls/envoy-rls/internal/refenv"
)

// lookupEnv reads the reference server's variables (tests replace it).
var lookupEnv refenv.Lookup = os.LookupEnv

// applyReference reads the reference server's environment when neither
// --config nor --config-xds was given (on the command line or as
// ENVOY_RLS_*), and sets every flag that was not given from it. When one
// was given, the reference's variables that choose the store or the config
// source must not be set: they would be ignored, and the service would run
// on another store or config than they say.
func applyReference(fs *flag.FlagSet, o *options, lookup refenv.Lookup) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, native := range []string{"config", "config-xds"} {
		if given[native] {
			return refuseSelectors(o.cmd.source(native), refenv.Selectors(lookup))
		}
	}
	res, err := refenv.Translate(lookup)
	if err != nil {
		return fmt.Errorf("no --config or --config-xds: reading the reference server's environment (envoyproxy/ratelimit):\n%v", err)
	}
	var errs []error
	for _, s := range res.Settings {
		if given[s.Flag] {
			continue
		}
		if fs.Lookup(s.Flag) == nil {
			errs = append(errs, fmt.Errorf("%s is not supported by this build of envoy-rls (no --%s)", s.From, s.Flag))
			continue
		}
		if err := fs.Set(s.Flag, s.Value); err != nil {
			errs = append(errs, fmt.Errorf("%s: --%s=%q: %v", s.From, s.Flag, s.Value, err))
		}
	}
	o.reference = res
	return errors.Join(errs...)
}

// refuseSelectors is the error for the reference's store- and
// config-selecting variables set beside native, the flag that chose the
// native configuration; nil when there are none.
func refuseSelectors(native string, sel []refenv.Selector) error {
	if len(sel) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s is given, so the reference server's environment (envoyproxy/ratelimit) is not read, "+
		"but these of its variables, which choose the store or the config source, are set:", native)
	for _, s := range sel {
		fmt.Fprintf(&b, "\n  %s (natively: %s)", s.Var, s.Use)
	}
	fmt.Fprintf(&b, "\nunset them and give the native flags (or ENVOY_RLS_* variables), or leave out %s to run from the reference's environment", native)
	return errors.New(b.String())
}

// logReference logs that the reference server's environment configures
// the service and, at debug level, what it set and which of its variables
// were set but mean nothing here; ref is nil when it was not read.
func logReference(ref *refenv.Result, log *slog.Logger) {
	if ref == nil {
		return
	}
	log.Info("no --config or --config-xds: configured from the reference server's environment (envoyproxy/ratelimit)")
	for _, ig := range ref.Ignored {
		log.Debug("reference variable accepted without effect", "variable", ig.Var, "reason", ig.Reason)
	}
	for _, s := range ref.Settings {
		v := s.Value
		switch {
		case strings.Contains(s.Flag, "password"):
			v = "xxxxx"
		case s.Flag == "redis-url":
			if u, err := url.Parse(v); err == nil {
				v = u.Redacted()
			}
		}
		log.Debug("reference setting", "flag", "--"+s.Flag, "value", v, "from", s.From)
	}
}
