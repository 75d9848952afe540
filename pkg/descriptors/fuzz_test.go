package descriptors

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the parser: it must never panic, and
// it either returns a config or errors that each name the file and a reason.
// The seeds are every YAML file under testdata and the example config.
func FuzzParse(f *testing.F) {
	var seeds []string
	_ = filepath.Walk("testdata", func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			seeds = append(seeds, path)
		}
		return nil
	})
	seeds = append(seeds, filepath.Join("..", "..", "examples", "ratelimit.yaml"))
	conf, _ := filepath.Glob(filepath.Join("..", "..", "test", "conformance", "configs", "*.yaml"))
	seeds = append(seeds, conf...)
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.yaml", data)
		// Lenient accepts all that strict accepts, with the same domains,
		// and its warnings name the file and a reason.
		lcfg, lerr := ParseDocumentsWith([]Document{{File: "fuzz.yaml", Data: data}}, Options{Lenient: true})
		if err == nil && (lerr != nil || strings.Join(lcfg.Domains(), ",") != strings.Join(cfg.Domains(), ",")) {
			t.Fatalf("strict accepts %v, lenient: %v %v", cfg.Domains(), lcfg.Domains(), lerr)
		}
		for _, w := range lcfg.Warnings() {
			if w.File != "fuzz.yaml" || w.Reason == "" {
				t.Fatalf("warning without file or reason: %+v", w)
			}
		}
		if err != nil {
			if cfg != nil {
				t.Fatalf("both a config and an error: %v", err)
			}
			errs, ok := err.(Errors)
			if !ok || len(errs) == 0 {
				t.Fatalf("error of type %T, want a non-empty Errors: %v", err, err)
			}
			for _, e := range errs {
				if e.File != "fuzz.yaml" || e.Reason == "" {
					t.Fatalf("error without file or reason: %+v", e)
				}
			}
			return
		}
		// A valid config matches without panicking.
		for _, name := range cfg.Domains() {
			d := cfg.Domain(name)
			d.Match([]Entry{{Key: "k", Value: "v"}}, nil)
			d.Match([]Entry{{Key: "a", Value: ""}, {Key: "b", Value: "x*y"}}, nil)
		}
	})
}
