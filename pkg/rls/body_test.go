package rls

import (
	"encoding/json"
	"testing"
)

func TestBodyTemplate(t *testing.T) {
	tpl, err := ParseBodyTemplate(`{"error":"rate_limited","rule":"{{rule}}","domain":"{{ domain }}","descriptor":{{descriptor_index}},"retry_after":{{retry_after}}}`)
	if err != nil {
		t.Fatal(err)
	}
	body := tpl.Render(BodyValues{Rule: `lo"gin\`, Domain: "example", DescriptorIndex: 2, RetryAfter: 7})
	var got map[string]any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	if got["rule"] != `lo"gin\` || got["domain"] != "example" || got["descriptor"] != 2.0 || got["retry_after"] != 7.0 || got["error"] != "rate_limited" {
		t.Errorf("rendered %s", body)
	}
	for _, bad := range []string{
		`{"rule":"{{rule}"}`,         // unclosed
		`{"rule":"{{name}}"}`,        // unknown
		`{"rule":{{rule}}}`,          // a string outside quotes
		`{"retry":"{{retry_after}}"`, // not JSON
		`not json {{retry_after}}`,   // not JSON
	} {
		if _, err := ParseBodyTemplate(bad); err == nil {
			t.Errorf("ParseBodyTemplate(%q) accepted", bad)
		}
	}
	if tpl, err := ParseBodyTemplate(`{"static":true}`); err != nil || string(tpl.Render(BodyValues{})) != `{"static":true}` {
		t.Errorf("static template: %v", err)
	}
}
