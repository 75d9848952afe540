package debugsrv_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/envoyrls/envoy-rls/internal/debugsrv"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

const egShaped = `domain: default/eg
descriptors:
  - key: default/eg/rule/0
    value: default/eg/rule/0
    descriptors:
      - key: rule-0-match-0
        descriptors:
          - key: masked_remote_address
            value: 0.0.0.0/0
            descriptors:
              - key: remote_address
                rate_limit:
                  unit: hour
                  requests_per_unit: 3
  - key: free
    rate_limit:
      unlimited: true
  - key: tb
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 10}
`

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

func TestRLConfig(t *testing.T) {
	cfg, err := descriptors.Parse("eg.yaml", []byte(egShaped))
	if err != nil {
		t.Fatal(err)
	}
	h := debugsrv.Handler(func() *descriptors.Config { return cfg })
	code, body := get(t, h, "/rlconfig")
	want := "default/eg.default/eg/rule/0_default/eg/rule/0.rule-0-match-0.masked_remote_address_0.0.0.0/0.remote_address: unit=HOUR requests_per_unit=3, shadow_mode: false, quota_mode: false\n" +
		"default/eg.free: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n" +
		"default/eg.tb: unit=SECOND requests_per_unit=5, shadow_mode: true, quota_mode: false, algorithm: token_bucket\n"
	if code != 200 || body != want {
		t.Fatalf("GET /rlconfig = %d\n%s\nwant\n%s", code, body, want)
	}
	code, body = get(t, h, "/rlconfig?format=json")
	var got []debugsrv.Descriptor
	if err := json.Unmarshal([]byte(body), &got); code != 200 || err != nil {
		t.Fatalf("json: %d %v\n%s", code, err, body)
	}
	if len(got) != 6 || got[4].Key != "free" || !got[4].Limits[0].Unlimited || got[5].Limits[0].Burst != 10 || got[3].Limits[0].Unit != "HOUR" || got[0].Line != 3 {
		t.Fatalf("json form = %+v", got)
	}
	if code, _ := get(t, h, "/debug/pprof/"); code != 200 {
		t.Fatalf("pprof index: %d", code)
	}
	// Before the first config: empty, not an error.
	empty := debugsrv.Handler(func() *descriptors.Config { return nil })
	if code, body := get(t, empty, "/rlconfig"); code != 200 || body != "" {
		t.Fatalf("no config: %d %q", code, body)
	}
	if code, body := get(t, empty, "/rlconfig?format=json"); code != 200 || body != "[]\n" {
		t.Fatalf("no config, json: %d %q", code, body)
	}
}

// A domain merged from several documents names each descriptor's own file.
func TestRLConfigMergedFiles(t *testing.T) {
	cfg, err := descriptors.ParseDocumentsWith([]descriptors.Document{
		{File: "a.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")},
		{File: "b.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit: {unit: hour, requests_per_unit: 2}\n")},
	}, descriptors.Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	_, body := get(t, debugsrv.Handler(func() *descriptors.Config { return cfg }), "/rlconfig?format=json")
	var got []debugsrv.Descriptor
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, d := range got {
		files[d.Key] = d.File
	}
	if files["a"] != "a.yaml" || files["b"] != "b.yaml" || files["c"] != "b.yaml" {
		t.Fatalf("files %v", files)
	}
}
