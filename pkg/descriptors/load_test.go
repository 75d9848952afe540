package descriptors

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// TestReferenceConfigs loads configurations in the style of the reference
// server's README, which use no extension, and matches as it does.
func TestReferenceConfigs(t *testing.T) {
	c := mustLoad(t, "testdata/reference")
	if got, want := strings.Join(c.Domains(), ","), "db_ops,depth,edge_per_ip,features,notifications"; got != want {
		t.Fatalf("domains %s, want %s", got, want)
	}

	db := mustDomain(t, c, "db_ops")
	runMatches(t, db, []matchCase{
		{[]string{"database=orders"}, "database=orders@5"},
		{[]string{"database=default"}, "database=default@10"},
		{[]string{"database=other"}, "nil"},
	})
	l := db.Match(entries("database=default"), nil)[0].Limits[0]
	if l.Unit != "SECOND" || l.RequestsPerUnit != 300 || l.Limit != (algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 300, Window: time.Second}) {
		t.Errorf("unit SECOND limit compiled to %+v", l)
	}

	n := mustDomain(t, c, "notifications")
	runMatches(t, n, []matchCase{
		{[]string{"kind=promo", "phone=555"}, "kind=promo@4/phone=@7"},
		{[]string{"phone=555"}, "phone=@12"},
		{[]string{"kind=promo"}, "kind=promo@4"},
		{[]string{"kind=other", "phone=555"}, "nil"},
	})

	ip := mustDomain(t, c, "edge_per_ip")
	if l := ip.Match(entries("remote_address=10.9.8.7"), nil)[0].Limits[0]; l.RequestsPerUnit != 0 || l.Limit.Requests != 0 {
		t.Errorf("blocked address limit %+v, want 0 requests", l)
	}
	if l := ip.Match(entries("remote_address=10.0.0.1"), nil)[0].Limits[0]; l.RequestsPerUnit != 20 {
		t.Errorf("default address limit %+v, want 20", l)
	}

	f := mustDomain(t, c, "features")
	node := func(kvs ...string) *Node {
		t.Helper()
		p := f.Match(entries(kvs...), nil)
		if p == nil {
			t.Fatalf("%v matched nothing", kvs)
		}
		return p[len(p)-1]
	}
	if l := node("internal=x").Limits[0]; !l.Unlimited || l.ID != "unlimited" {
		t.Errorf("unlimited limit %+v", l)
	}
	if l := node("service=s", "client=canary").Limits[0]; !l.Shadow {
		t.Error("shadow_mode of the node did not reach its limit")
	}
	if l := node("service=s", "client=stable").Limits[0]; l.Shadow {
		t.Error("stable client limit is shadowed")
	}
	if l := node("region=eu", "account=a42").Limits[0]; l.Name != "account_a42" {
		t.Errorf("name %q", l.Name)
	}
	if l := node("region=us", "account=a42").Limits[0]; fmt.Sprint(l.Replaces) != "[account_a42]" {
		t.Errorf("replaces %v", l.Replaces)
	}
	if n := node("endpoint=health"); len(n.Limits) != 0 {
		t.Error("whitelisted endpoint has limits")
	}
	if n := node("path=/static/img/logo.png"); n.Value != "/static/*" || len(n.Limits) != 1 {
		t.Errorf("wildcard path matched %s", n.Value)
	}
	if n := node("tenant=t1"); !n.QuotaMode || !n.ValueToMetric || n.Limits[0].Unit != "WEEK" || n.Limits[0].Limit.Window != 7*24*time.Hour {
		t.Errorf("tenant node %+v", n)
	}
	if n := node("flag=yes"); n.Value != "yes" {
		t.Errorf("value: yes read as %q", n.Value)
	}
	if n := node("number=123"); n.Value != "123" {
		t.Errorf("value: 123 read as %q", n.Value)
	}
}

func TestLoadDirectory(t *testing.T) {
	// dir holds two configs, plus a dotfile, a .txt file and a
	// subdirectory with invalid YAML that must all be skipped.
	c := mustLoad(t, "testdata/dir")
	if got := strings.Join(c.Domains(), ","); got != "alpha,beta" {
		t.Errorf("domains %s, want alpha,beta", got)
	}
	if d := mustDomain(t, c, "alpha"); d.File != filepath.Join("testdata/dir", "a.yaml") || d.Line != 1 {
		t.Errorf("alpha defined at %s:%d", d.File, d.Line)
	}
}

func TestLoadDuplicateDomain(t *testing.T) {
	_, err := Load("testdata/dupdomain")
	equalLines(t, errorLines(t, err), []string{
		`testdata/dupdomain/three.yaml:4: invalid unit "lightyear" (want second, minute, hour, day, week, month or year)`,
		`testdata/dupdomain/two.yaml:2: duplicate domain "shared" (also defined at testdata/dupdomain/one.yaml:1)`,
	})
}

func TestLoadReportsManyErrors(t *testing.T) {
	_, err := Load("testdata/errors/many.yaml")
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("error %v is not an Errors", err)
	}
	want := wantErrors(t, "testdata/errors/many.yaml")
	if len(errs) != len(want) || len(errs) < 10 {
		t.Fatalf("got %d errors, want all %d:\n%v", len(errs), len(want), err)
	}
	for i := 1; i < len(errs); i++ {
		if errs[i].Line < errs[i-1].Line {
			t.Errorf("errors not in line order: %v before %v", errs[i-1], errs[i])
		}
	}
}

func TestLoadFailures(t *testing.T) {
	_, err := Load("testdata/no-such-file.yaml")
	equalLines(t, errorLines(t, err), []string{"testdata/no-such-file.yaml: cannot read: no such file or directory"})

	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, "README"), []byte("not a config"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(empty)
	equalLines(t, errorLines(t, err), []string{empty + ": no *.yaml or *.yml files in directory"})
}

func TestLoadFollowsSymlinks(t *testing.T) {
	dir := t.TempDir()
	target, err := filepath.Abs("testdata/dir/a.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "linked.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(t.TempDir(), filepath.Join(dir, "subdir.yaml")); err != nil {
		t.Fatal(err)
	}
	c := mustLoad(t, dir)
	if got := strings.Join(c.Domains(), ","); got != "alpha" {
		t.Errorf("domains %s, want alpha", got)
	}
}

// TestExampleConfig loads the descriptor configuration shipped in
// examples/.
func TestExampleConfig(t *testing.T) {
	c := mustLoad(t, "../../examples/ratelimit.yaml")
	if len(c.Domains()) != 1 {
		t.Errorf("domains %v", c.Domains())
	}
}

func TestParseDocuments(t *testing.T) {
	c, err := ParseDocuments([]Document{
		{File: "a", Data: []byte("domain: ns/a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")},
		{File: "b", Data: []byte("domain: b\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Domains(); len(got) != 2 || got[0] != "b" || got[1] != "ns/a" {
		t.Fatalf("domains = %v", got)
	}
	_, err = ParseDocuments([]Document{{File: "a", Data: []byte("domain: d\n")}, {File: "b", Data: []byte("domain: d\n")}})
	if err == nil || !strings.Contains(err.Error(), `b:1: duplicate domain "d" (also defined at a:1)`) {
		t.Fatalf("duplicate domain: %v", err)
	}
	if c, err := ParseDocuments(nil); err != nil || len(c.Domains()) != 0 {
		t.Fatalf("no documents: %v, %v", c, err)
	}
}

// Envoy Gateway dumps the configs it serves as YAML with the resource's
// name at the top, every field spelled out (null limits on inner levels,
// empty replaces, false flags). Such a file loads.
func TestEnvoyGatewayDumpLoads(t *testing.T) {
	const dump = `name: default/eg/http
domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0
    value: httproute/default/backend/rule/0
    rate_limit: null
    descriptors:
      - key: rule-0-match-0
        value: ""
        rate_limit: null
        descriptors:
          - key: masked_remote_address
            value: 0.0.0.0/0
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
    shadow_mode: false
    quota_mode: false
    detailed_metric: false
    value_to_metric: false
    share_threshold: false
`
	c, err := Parse("eg.yaml", []byte(dump))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Domain("default/eg/http").Match([]Entry{
		{"httproute/default/backend/rule/0", "httproute/default/backend/rule/0"},
		{"rule-0-match-0", "alice"},
		{"masked_remote_address", "0.0.0.0/0"},
	}, nil)
	if len(p) != 3 || len(p[2].Limits) != 1 || p[2].Limits[0].RequestsPerUnit != 3 || p[2].Limits[0].Unit != "HOUR" {
		t.Fatalf("match = %v", p)
	}
}

// SelectFiles lists what LoadWith reads from a directory and every entry it
// does not, with the option that would read it.
func TestSelectFilesNamesWhatItSkips(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"a.yaml": "domain: a\n", "noext": "domain: n\n", ".dot.yaml": "domain: h\n", "..2026_01_01/cm": "domain: c\n"} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for target, name := range map[string]string{"..2026_01_01": "..data", "..data/cm": "cm"} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	files, skipped, err := SelectFiles(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[0] != filepath.Join(dir, "a.yaml") {
		t.Errorf("files %q, want a.yaml alone", files)
	}
	got := map[string]string{}
	for _, s := range skipped {
		got[filepath.Base(s.Path)] = s.Reason + "|" + s.Option
	}
	want := map[string]string{
		"..2026_01_01": SkipAtomicWriter + "|", "..data": SkipAtomicWriter + "|",
		".dot.yaml": SkipDotfile + "|Dotfiles", "cm": SkipExtension + "|AllFiles", "noext": SkipExtension + "|AllFiles",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("skipped %v, want %v", got, want)
	}
	// With every option, the ConfigMap's key is read through its link, once.
	files, _, err = SelectFiles(dir, Options{AllFiles: true, Dotfiles: true, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadWith(dir, Options{AllFiles: true, Dotfiles: true, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 4 || len(cfg.Domains()) != 4 {
		t.Errorf("every option: files %q, %d domains, want 4 of each", files, len(cfg.Domains()))
	}
}
