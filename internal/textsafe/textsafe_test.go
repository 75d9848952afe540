package textsafe

import (
	"testing"
	"unicode/utf8"
)

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"":                "",
		"plain":           "plain",
		"café ✓":          "café ✓",
		"\xff":            `\xff`,
		"a\xffb\xfe":      `a\xffb\xfe`,
		"caf\xc3":         `caf\xc3`,         // a truncated sequence
		"\xed\xa0\x80":    `\xed\xa0\x80`,    // a UTF-16 surrogate
		"\xc0\xaf":        `\xc0\xaf`,        // an overlong '/'
		"ok é \x80 ✓\xe2": `ok é \x80 ✓\xe2`, // valid characters around invalid bytes stay
	} {
		got := Escape(in)
		if got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("Escape(%q) = %q is not valid UTF-8", in, got)
		}
	}
}

func FuzzEscape(f *testing.F) {
	f.Add("a\xffb")
	f.Fuzz(func(t *testing.T, s string) {
		got := Escape(s)
		if !utf8.ValidString(got) {
			t.Fatalf("Escape(%q) = %q is not valid UTF-8", s, got)
		}
		if utf8.ValidString(s) != (got == s) {
			t.Fatalf("Escape(%q) = %q", s, got)
		}
	})
}
