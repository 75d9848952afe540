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
