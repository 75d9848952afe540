package descriptors

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// wantErrors reads the expected errors of a fixture: a "# want: reason"
// comment expects an error at its own line, "# want-noline: reason" one
// without a line. A line may carry several "# want:" comments.
func wantErrors(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i, line := range strings.Split(string(data), "\n") {
		if reason, ok := strings.CutPrefix(line, "# want-noline: "); ok {
			want = append(want, file+": "+reason)
			continue
		}
		parts := strings.Split(line, "# want: ")
		for _, reason := range parts[1:] {
			want = append(want, file+":"+strconv.Itoa(i+1)+": "+strings.TrimSpace(reason))
		}
	}
	if len(want) == 0 {
		t.Fatalf("%s has no # want comment", file)
	}
	return want
}

// errorLines returns the lines of err, which must be an Errors.
func errorLines(t *testing.T, err error) []string {
	t.Helper()
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("error %v (%T) is not an Errors", err, err)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(errs) {
		t.Fatalf("Error() has %d lines for %d errors", len(lines), len(errs))
	}
	return lines
}

func equalLines(t *testing.T, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors:\n  got  %s\n  want %s", strings.Join(got, "\n       "), strings.Join(want, "\n       "))
	}
}

// TestErrorFixtures loads every fixture of testdata/errors, one bad case
// each, and checks the exact messages (and that nothing else is reported).
func TestErrorFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/errors/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			want := wantErrors(t, file)
			c, err := Load(file)
			if c != nil {
				t.Errorf("Load returned a config with an error")
			}
			equalLines(t, errorLines(t, err), want)

			data, rerr := os.ReadFile(file)
			if rerr != nil {
				t.Fatal(rerr)
			}
			_, err = Parse(file, data)
			equalLines(t, errorLines(t, err), want)
		})
	}
}

// TestYAMLErrorOnEveryLine breaks each line of the example config in turn,
// with a tab before it or a character that cannot start a token, and
// checks that the syntax error names exactly that line. yaml.v3 itself
// names the line where the enclosing block starts, or no line.
func TestYAMLErrorOnEveryLine(t *testing.T) {
	data, err := os.ReadFile("../../examples/ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	breakers := map[string]func(string) string{
		"tab": func(l string) string { return "\t" + l },
		"at": func(l string) string {
			content := strings.TrimLeft(l, " ")
			return l[:len(l)-len(content)] + "@" + content
		},
	}
	for name, breakLine := range breakers {
		checked := 0
		for i, l := range lines {
			if s := strings.TrimSpace(l); s == "" || strings.HasPrefix(s, "#") {
				continue
			}
			broken := append([]string(nil), lines...)
			broken[i] = breakLine(l)
			_, err := Parse("f.yaml", []byte(strings.Join(broken, "\n")))
			var errs Errors
			if !errors.As(err, &errs) || len(errs) != 1 || !strings.HasPrefix(errs[0].Reason, "invalid YAML: ") {
				t.Fatalf("%s on line %d: got %v, want one YAML syntax error", name, i+1, err)
			}
			if errs[0].Line != i+1 {
				t.Errorf("%s on line %d %q: error names line %d: %v", name, i+1, broken[i], errs[0].Line, errs[0])
			}
			checked++
		}
		if checked < 50 {
			t.Fatalf("%s: only %d lines checked", name, checked)
		}
	}
}
