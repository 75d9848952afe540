package descriptors

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeTree writes files (path relative to root -> contents) and returns
// root.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, data := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func symlink(t *testing.T, target, name string) {
	t.Helper()
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}

func domainDoc(name, key string) string {
	return "domain: " + name + "\ndescriptors:\n  - key: " + key + "\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
}

func loadedDomains(t *testing.T, path string, o Options) string {
	t.Helper()
	c, err := LoadWith(path, o)
	if err != nil {
		t.Fatalf("LoadWith(%+v): %v", o, err)
	}
	return strings.Join(c.Domains(), ",")
}

// TestLoadOptionsSelectFiles: which files each option reads, on a directory
// shaped as the reference's runtime directory and a mounted ConfigMap.
func TestLoadOptionsSelectFiles(t *testing.T) {
	root := writeTree(t, map[string]string{
		"a.yaml":              domainDoc("a", "k"),
		"b.yml":               domainDoc("b", "k"),
		"c.conf":              domainDoc("c", "k"),
		"noext":               domainDoc("noext", "k"),
		".hidden.yaml":        domainDoc("hidden", "k"),
		"sub/d.yaml":          domainDoc("d", "k"),
		"sub/deeper/e.txt":    domainDoc("e", "k"),
		".dotdir/f.yaml":      domainDoc("f", "k"),
		"..2026_12_01/g.yaml": domainDoc("g", "k"), // a ConfigMap's atomic writer data
		"elsewhere/h.yaml":    domainDoc("h", "k"),
	})
	symlink(t, "..2026_12_01", filepath.Join(root, "..data"))
	symlink(t, "..data/g.yaml", filepath.Join(root, "g.yaml"))                // ConfigMap key, followed
	symlink(t, filepath.Join(root, "elsewhere"), filepath.Join(root, "link")) // a link to a directory: not followed
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{}, "a,b,g"},
		{Options{AllFiles: true}, "a,b,c,g,noext"},
		{Options{Recursive: true}, "a,b,d,g,h"},
		{Options{Dotfiles: true}, "a,b,g,hidden"},
		{Options{Recursive: true, AllFiles: true, Dotfiles: true}, "a,b,c,d,e,f,g,h,hidden,noext"},
		{Options{Recursive: true, AllFiles: true}, "a,b,c,d,e,g,h,noext"},
	} {
		if got := loadedDomains(t, root, c.o); got != c.want {
			t.Errorf("%+v: domains %s, want %s", c.o, got, c.want)
		}
	}
}

// TestLoadOptionsEmptyDirectory names what was looked for.
func TestLoadOptionsEmptyDirectory(t *testing.T) {
	root := writeTree(t, map[string]string{"notes.txt": "x"})
	if _, err := LoadWith(root, Options{}); err == nil || !strings.Contains(err.Error(), "no *.yaml or *.yml files") {
		t.Errorf("yaml only: %v", err)
	}
	empty := t.TempDir()
	if _, err := LoadWith(empty, Options{AllFiles: true}); err == nil || !strings.Contains(err.Error(), "no files in directory") {
		t.Errorf("all files: %v", err)
	}
	// Every file is a config under AllFiles: a stray note is an error, as
	// for the reference.
	if _, err := LoadWith(root, Options{AllFiles: true}); err == nil || !strings.Contains(err.Error(), "notes.txt") {
		t.Errorf("stray file: %v", err)
	}
}

// TestMultiDocumentFile: a file holding several domains separated by ---,
// as Envoy Gateway dumps the configs it serves (with the fields it always
// writes: name, rate_limit: null, empty lists, false flags).
func TestMultiDocumentFile(t *testing.T) {
	dump := `name: default/eg/http
domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0/match/0/backend
    value: httproute/default/backend/rule/0/match/0/backend
    rate_limit: null
    descriptors:
      - key: rule-0-match-0
        value: ""
        rate_limit:
          requests_per_unit: 3
          unit: HOUR
          unlimited: false
          name: ""
          replaces: []
        descriptors: []
        shadow_mode: false
        quota_mode: false
        detailed_metric: false
        value_to_metric: false
        share_threshold: false
    shadow_mode: false
    quota_mode: false
    detailed_metric: false
    value_to_metric: false
    share_threshold: false
---
name: team-a/shared-policy
domain: team-a/shared-policy
descriptors:
  - key: team-a/shared-policy/rule/0
    value: team-a/shared-policy/rule/0
    rate_limit:
      requests_per_unit: 10
      unit: MINUTE
---
`
	root := writeTree(t, map[string]string{"ratelimit.yaml": dump})
	c, err := Load(filepath.Join(root, "ratelimit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), ","); got != "default/eg/http,team-a/shared-policy" {
		t.Fatalf("domains %s", got)
	}
	d := mustDomain(t, c, "default/eg/http")
	p := d.Match(entries("httproute/default/backend/rule/0/match/0/backend=httproute/default/backend/rule/0/match/0/backend", "rule-0-match-0=alice"), nil)
	if p == nil || len(p[1].Limits) != 1 || p[1].Limits[0].RequestsPerUnit != 3 {
		t.Fatalf("leaf limit not found: %v", describePath(p))
	}
	// Errors in a later document carry the file's own line numbers.
	bad := writeTree(t, map[string]string{"x.yaml": domainDoc("one", "k") + "---\ndomain: two\ndescriptors:\n  - value: v\n"})
	_, err = Load(filepath.Join(bad, "x.yaml"))
	if err == nil || !strings.Contains(err.Error(), "x.yaml:8: descriptor has no key") {
		t.Fatalf("error in the second document: %v", err)
	}
}

// TestMergeDomains: MERGE_DOMAIN_CONFIG puts the top-level descriptors of
// one domain's files together; a key and value both define is an error,
// without it any second definition is.
func TestMergeDomains(t *testing.T) {
	root := writeTree(t, map[string]string{
		"1.yaml": domainDoc("shared", "k"),
		"2.yaml": "domain: shared\ndescriptors:\n  - key: j\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 7}\n  - key: w\n    value: 'a*'\n    rate_limit: {unit: second, requests_per_unit: 8}\n",
		"3.yaml": "domain: shared\ndescriptors:\n  - key: w\n    value: 'ab*'\n    rate_limit: {unit: second, requests_per_unit: 9}\n  - key: z\n    rate_limit: {unit: second, requests_per_unit: 9}\n",
		"4.yaml": domainDoc("other", "k"),
	})
	if _, err := LoadWith(root, Options{}); err == nil || !strings.Contains(err.Error(), `duplicate domain "shared"`) {
		t.Fatalf("without merging: %v", err)
	}
	c, err := LoadWith(root, Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Domains(), ","); got != "other,shared" {
		t.Fatalf("domains %s", got)
	}
	d := mustDomain(t, c, "shared")
	for _, tc := range []struct {
		entry string
		want  uint32
	}{{"k=x", 1}, {"j=x", 5}, {"k=v", 7}, {"w=abc", 8}} { // the first file's wildcard comes first
		p := d.Match(entries(tc.entry), nil)
		if p == nil || len(p[0].Limits) != 1 || p[0].Limits[0].RequestsPerUnit != tc.want {
			t.Errorf("%s: %v, want a limit of %d", tc.entry, describePath(p), tc.want)
		}
	}
	// Each node knows its own file.
	for _, tc := range []struct{ entry, file string }{{"k=x", "1.yaml"}, {"j=x", "2.yaml"}, {"w=abc", "2.yaml"}, {"z=1", "3.yaml"}} {
		p := d.Match(entries(tc.entry), nil)
		if p == nil || d.NodeFile(p[0]) != filepath.Join(root, tc.file) {
			t.Errorf("%s: file %v, want %s", tc.entry, p, tc.file)
		}
	}
	// The same key and value in two files.
	dup := writeTree(t, map[string]string{
		"1.yaml": domainDoc("shared", "k"),
		"2.yaml": "domain: shared\ndescriptors:\n  - key: j\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
	})
	_, err = LoadWith(dup, Options{MergeDomains: true})
	want := filepath.Join(dup, "2.yaml") + `:5: domain "shared": descriptor with key "k" and no value is also defined at ` + filepath.Join(dup, "1.yaml") + ":3"
	if err == nil || err.Error() != want {
		t.Fatalf("duplicate descriptor:\n got %v\nwant %s", err, want)
	}
	// Documents (xDS resources) merge the same way.
	c, err = ParseDocumentsWith([]Document{{File: "a", Data: []byte(domainDoc("d", "k"))}, {File: "b", Data: []byte(domainDoc("d", "j"))}}, Options{MergeDomains: true})
	if err != nil || c.Domain("d").Match(entries("j=1"), nil) == nil {
		t.Fatalf("documents: %v", err)
	}
}
