// Package docs holds the user documentation (the *.md pages beside this
// file) and the test that keeps its links true.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// mdLink is an inline Markdown link or image: [text](target) or
// [text](target "title").
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// pages are the Markdown files whose links are checked: the README, the
// contributing guide and every page here.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no pages in docs/")
	}
	out := []string{filepath.Join("..", "README.md"), filepath.Join("..", "CONTRIBUTING.md")}
	return append(out, docs...)
}

// prose returns the lines of a Markdown file outside fenced code blocks.
func prose(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// slug is GitHub's anchor of a heading: lower case, every character but
// letters, digits, spaces, hyphens and underscores dropped, spaces made
// hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown file's headings, with GitHub's
// -1, -2 ... suffixes for repeated ones.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(text) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimLeft(line, "#")
		if !strings.HasPrefix(h, " ") {
			continue
		}
		s := slug(strings.TrimSpace(h))
		if n := seen[s]; n > 0 {
			out[s+"-"+itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func itoa(n int) string {
	const digits = "0123456789"
	if n < 10 {
		return digits[n : n+1]
	}
	return itoa(n/10) + digits[n%10:n%10+1]
}

// TestLinks fails when a relative link of the README, CONTRIBUTING.md or a
// docs page names a file that does not exist, or an anchor that no heading
// of its target has.
func TestLinks(t *testing.T) {
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, bool) {
		if a, ok := cache[path]; ok {
			return a, true
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, false
		}
		cache[path] = anchors(string(b))
		return cache[path], true
	}
	for _, page := range pages(t) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range prose(string(b)) {
			// Inline code is not a link.
			line = regexp.MustCompile("`[^`]*`").ReplaceAllString(line, "")
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
					if _, err := os.Stat(path); err != nil {
						t.Errorf("%s (prose line %d): link to %s: no such file", page, n+1, target)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(path, ".md") {
					continue
				}
				a, ok := anchorsOf(path)
				if !ok {
					t.Errorf("%s: link to %s: cannot read %s", page, target, path)
					continue
				}
				if !a[anchor] {
					t.Errorf("%s (prose line %d): link to %s: %s has no heading with anchor #%s", page, n+1, target, path, anchor)
				}
			}
		}
	}
}

// TestEveryPageIsLinkedFromTheReadme fails when a docs page cannot be found
// from the README.
func TestEveryPageIsLinkedFromTheReadme(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, m := range mdLink.FindAllStringSubmatch(string(readme), -1) {
		file, _, _ := strings.Cut(m[1], "#")
		linked[filepath.Clean(file)] = true
	}
	docs, _ := filepath.Glob("*.md")
	for _, d := range docs {
		if !linked[filepath.Join("docs", d)] {
			t.Errorf("docs/%s is not linked from the README", d)
		}
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Migrating from envoyproxy/ratelimit":             "migrating-from-envoyproxyratelimit",
		"`make bench`: every figure beside the floor":     "make-bench-every-figure-beside-the-floor",
		"Drop-in for the reference server: Envoy Gateway": "drop-in-for-the-reference-server-envoy-gateway",
		"Lenient loading: what the reference accepts":     "lenient-loading-what-the-reference-accepts",
		"Envoy Gateway, Istio and kgateway":               "envoy-gateway-istio-and-kgateway",
		"What `usage_accounting` does":                    "what-usage_accounting-does",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}
