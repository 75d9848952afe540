package descriptors

import (
	"fmt"
	"strings"
	"testing"
)

// bigConfig returns a config of n descriptors without any alias.
func bigConfig(n int) []byte {
	var b strings.Builder
	b.WriteString("domain: big\ndescriptors:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - key: k\n    value: v%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, i%1000+1)
	}
	return []byte(b.String())
}

// TestLargeConfigWithoutAliasesLoads: the alias guard counts only what
// aliases add, so 100,000 descriptors (well over a million YAML nodes)
// load and match.
func TestLargeConfigWithoutAliasesLoads(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 20_000
	}
	data := bigConfig(n)
	c, err := Parse("big.yaml", data)
	if err != nil {
		t.Fatalf("%d descriptors: %v", n, firstLines(err.Error(), 3))
	}
	last := fmt.Sprintf("k=v%d", n-1)
	path := mustDomain(t, c, "big").Match(entries(last), nil)
	if len(path) != 1 || path[0].Limits[0].RequestsPerUnit != uint32((n-1)%1000+1) {
		t.Fatalf("descriptor %s not matched: %v", last, path)
	}
}

// TestAliasGuardCountsOnlyWhatAliasesAdd: a big literal document plus a
// few small aliases loads; aliases that add more than the bound are
// refused, whatever the document's own size.
func TestAliasGuardCountsOnlyWhatAliasesAdd(t *testing.T) {
	data := append(bigConfig(20_000), []byte(`  - key: a
    rate_limit: &lim {unit: second, requests_per_unit: 7}
  - key: b
    rate_limit: *lim
`)...)
	if _, err := Parse("aliases.yaml", data); err != nil {
		t.Fatalf("small aliases in a big document: %v", firstLines(err.Error(), 3))
	}

	// Each level doubles: 2^21 expanded scalars from a 30-line document.
	var b strings.Builder
	b.WriteString("domain: bomb\ndescriptors:\n  - key: k\n    metadata:\n      l0: &l0 [x, x]\n")
	for i := 1; i <= 20; i++ {
		fmt.Fprintf(&b, "      l%d: &l%d [*l%d, *l%d]\n", i, i, i-1, i-1)
	}
	_, err := Parse("bomb.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "bomb.yaml:1: aliases add more than 1000000 nodes to the file") {
		t.Fatalf("alias bomb: %v", err)
	}
}

// nestedMetadata returns a config whose metadata nests depth levels.
func nestedMetadata(depth int) []byte {
	var b strings.Builder
	b.WriteString("domain: deep\ndescriptors:\n  - key: k\n    metadata: ")
	for i := 0; i < depth-1; i++ {
		b.WriteString("{a: ")
	}
	b.WriteString("{a: 1}")
	b.WriteString(strings.Repeat("}", depth-1))
	b.WriteString("\n")
	return []byte(b.String())
}

// TestMetadataDepthBounded: metadata nested up to MaxMetadataDepth loads;
// deeper is refused at load with the line, instead of reaching clients that
// cannot decode it.
func TestMetadataDepthBounded(t *testing.T) {
	c, err := Parse("ok.yaml", nestedMetadata(MaxMetadataDepth))
	if err != nil {
		t.Fatalf("depth %d: %v", MaxMetadataDepth, err)
	}
	md := mustDomain(t, c, "deep").Match(entries("k=x"), nil)[0].Metadata
	depth := 0
	for s := md; s != nil; s = s.Fields["a"].GetStructValue() {
		depth++
	}
	if depth != MaxMetadataDepth {
		t.Errorf("loaded depth %d, want %d", depth, MaxMetadataDepth)
	}
	for _, d := range []int{MaxMetadataDepth + 1, 5000} {
		_, err := Parse("deep.yaml", nestedMetadata(d))
		want := fmt.Sprintf("deep.yaml:4: metadata is nested more than %d levels deep", MaxMetadataDepth)
		if err == nil || err.Error() != want {
			t.Errorf("depth %d: got %v, want %q", d, err, want)
		}
	}
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
