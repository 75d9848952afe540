package main

// The config source: files (--config) or an xDS control plane
// (--config-xds), how they are read and when they are read again.

import (
	"errors"
	"log/slog"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// sourceOptions say where the config comes from and how it is read.
type sourceOptions struct {
	Config      string
	ConfigXDS   string
	WatchConfig bool
	WatchRoot   string
	ReloadHold  time.Duration
	ForceStart  bool
	Load        loadOptions
	XDS         xdsOptions
}

func (o *sourceOptions) addFlags(fs *flagSet) {
	fs.StringVar(&o.Config, "config", "", "descriptor config: a YAML file or a directory of them (required)")
	fs.StringVar(&o.ConfigXDS, "config-xds", "", "take the descriptor config from this xDS control plane (host:port; ADS, state of the world, type ratelimit.config.ratelimit.v3.RateLimitConfig) instead of --config")
	fs.BoolVar(&o.WatchConfig, "watch-config", true, "reload the config when its files change (SIGHUP always reloads)")
	fs.DurationVar(&o.ReloadHold, "config-reload-hold", defaultReloadHold, "reload a config file written in place only once it has had no write for this long, so that a writer pausing mid-file is never loaded half-written; a file replaced atomically (renamed over the old one, a ConfigMap's ..data swap) reloads within 2 s whatever this is (0: in place as atomic)")
	fs.StringVar(&o.WatchRoot, "watch-root", "", "also reload when this directory (or symlink) is replaced, as the reference's RUNTIME_WATCH_ROOT does for RUNTIME_ROOT")
	fs.BoolVar(&o.ForceStart, "force-start-without-initial-config", false, "serve without a config: with --config-xds before the first one arrives, with --config when its files are there but do not load at start (then the next valid one is loaded as files change; a missing path exits 1); calls fail with \"no rate limit configuration loaded\" until then. Without it --config-xds waits and a --config that does not load exits 1")
	o.Load.addFlags(fs)
}

func (o sourceOptions) validate() []error {
	var errs []error
	switch {
	case o.Config == "" && o.ConfigXDS == "":
		errs = append(errs, errors.New("--config is required: a YAML file or a directory of them (or set ENVOY_RLS_CONFIG; --config-xds takes the config from a control plane)"))
	case o.Config != "" && o.ConfigXDS != "":
		errs = append(errs, errors.New("--config and --config-xds exclude each other"))
	}
	if o.ReloadHold < 0 {
		errs = append(errs, errors.New("--config-reload-hold must not be negative"))
	}
	return append(errs, o.XDS.validate()...)
}

// name names the source in logs: the path, or xds://host:port.
func (o sourceOptions) name() string {
	if o.ConfigXDS != "" {
		return "xds://" + o.ConfigXDS
	}
	return o.Config
}

// loadOptions select the files of a --config directory and say how a
// config is read: how definitions of one domain combine (the reference
// server's RUNTIME_* and MERGE_DOMAIN_CONFIG set them), leniently or not,
// and whether RLQS buckets must match one descriptor only. serve and
// check-config share them.
type loadOptions struct {
	ConfigRecursive   bool
	ConfigAllFiles    bool
	ConfigDotfiles    bool
	MergeDomainConfig bool
	ConfigLenient     bool
	RLQS              bool
}

func (o *loadOptions) addFlags(fs *flagSet) {
	fs.BoolVar(&o.ConfigRecursive, "config-recursive", false, "a --config directory: also read its subdirectories (not through links to directories), as the reference server does")
	fs.BoolVar(&o.ConfigAllFiles, "config-all-files", false, "a --config directory: read every file, not only *.yaml and *.yml, as the reference server does")
	fs.BoolVar(&o.ConfigDotfiles, "config-dotfiles", false, "a --config directory: also read files and directories named .* (never Kubernetes' ..data entries), as the reference server does without RUNTIME_IGNOREDOTFILES")
	fs.BoolVar(&o.ConfigLenient, "config-lenient", false, "accept every config the reference server accepts, with its meaning, and log a warning for each thing accepted that way (a field given twice: the last is used; a field where it means nothing: ignored; requests_per_unit beside unlimited: ignored; no requests_per_unit: 0, every request denied; a later document of a file that does not load: skipped); on under the reference's environment")
	fs.BoolVar(&o.RLQS, "rlqs", false, "serve the Rate Limit Quota Service (Envoy's rate_limit_quota filter) on the gRPC port beside RLS, from the same config (see docs/rlqs.md); the config is then also refused where one quota bucket, which has no key order, could match two descriptors")
	fs.BoolVar(&o.MergeDomainConfig, "merge-domain-config", false, "let several files (or xDS resources) define one domain: their top-level descriptors are merged; one key and value defined twice is an error (the reference's MERGE_DOMAIN_CONFIG)")
}

// descriptorOptions are the loader's options.
func (o loadOptions) descriptorOptions() descriptors.Options {
	return descriptors.Options{
		Recursive:    o.ConfigRecursive,
		AllFiles:     o.ConfigAllFiles,
		Dotfiles:     o.ConfigDotfiles,
		MergeDomains: o.MergeDomainConfig,
		Lenient:      o.ConfigLenient,
		OrderFree:    o.RLQS,
	}
}

// logWarnings logs, once per load, what --config-lenient accepted as the
// reference server does: file:line and what was ignored or assumed.
func logWarnings(log *slog.Logger, cfg *descriptors.Config) {
	for _, w := range cfg.Warnings() {
		log.Warn("config accepted as the reference does: " + w.Error())
	}
}
