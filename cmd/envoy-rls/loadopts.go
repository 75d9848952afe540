package main

import (
	"flag"
	"log/slog"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// loadOptions select the files of a --config directory and say how a
// config is read: how definitions of one domain combine (the reference
// server's RUNTIME_* and MERGE_DOMAIN_CONFIG set them), leniently or not,
// and whether RLQS buckets must match one descriptor only.
type loadOptions struct {
	ConfigRecursive   bool
	ConfigAllFiles    bool
	ConfigDotfiles    bool
	MergeDomainConfig bool
	ConfigLenient     bool
	RLQS              bool
}

// addFileFlags adds the flags that select and combine config files (serve
// and check-config share them).
func addFileFlags(fs *flag.FlagSet, o *loadOptions) {
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
