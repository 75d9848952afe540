package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the flag table of docs/running.md from the flag definitions")

// The generated part of docs/running.md lies between these lines.
const (
	flagsBegin = "<!-- serve flags: generated from the flag definitions by `go test ./cmd/envoy-rls -run TestFlagsDoc -update-docs`; do not edit -->"
	flagsEnd   = "<!-- end of serve flags -->"
)

// TestFlagsDoc fails when docs/running.md's table of serve's flags differs
// from the flag definitions (names, variables, defaults, usage); with
// -update-docs it rewrites the table instead.
func TestFlagsDoc(t *testing.T) {
	var help bytes.Buffer
	o, err := parseServe([]string{"-h"}, &help)
	if !errors.Is(err, errHelp) || o.cmd == nil {
		t.Fatalf("serve -h: %v", err)
	}
	var table bytes.Buffer
	o.cmd.markdown(&table)
	const path = "../../docs/running.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, flagsBegin), strings.Index(doc, flagsEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the generated section (%q ... %q)", path, flagsBegin, flagsEnd)
	}
	want := doc[:i+len(flagsBegin)] + "\n" + table.String() + doc[j:]
	if want == doc {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s: the flag table differs from the flag definitions; run go test ./cmd/envoy-rls -run TestFlagsDoc -update-docs", path)
}

// TestFlagsDocTableEscapes checks that a usage with a | cannot break the
// table's columns.
func TestFlagsDocTableEscapes(t *testing.T) {
	c := newCommand("x", "", true)
	c.fs.String("a-b", "p|q", "one | two")
	var b bytes.Buffer
	c.markdown(&b)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines: %q", len(lines), b.String())
	}
	if got := strings.Count(strings.ReplaceAll(lines[2], `\|`, ""), "|"); got != 5 {
		t.Errorf("row %q has %d column bars, want 5", lines[2], got)
	}
	if !strings.Contains(lines[2], "`ENVOY_RLS_A_B`") {
		t.Errorf("row %q lacks the variable", lines[2])
	}
}
