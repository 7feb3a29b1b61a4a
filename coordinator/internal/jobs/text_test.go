package jobs

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	storagev1 "github.com/leasehold/leasehold/gen/leasehold/storage/v1"
	"google.golang.org/protobuf/proto"
)

func TestValidText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		s    string
		want bool
	}{
		{"the empty string", "", true},
		{"ASCII with spaces and punctuation", `renderer 1.5 rollout: "bad" <b>`, true},
		{"accents, CJK, right-to-left letters and emoji", "résumé 報告 שלום مرحبا 🧾", true},
		{"a literal replacement character", "a\uFFFDb", true},
		{"the direction marks LRM, RLM and ALM", "a\u200Eb\u200Fc\u061Cd", true},
		{"a zero-width joiner", "👩\u200D💻", true},

		{"a byte that is not UTF-8", "a\xffb", false},
		{"a lone continuation byte", "\x80", false},
		{"a truncated sequence", "\xe2\x82", false},
		{"an overlong slash", "\xc0\xaf", false},
		{"an overlong NUL", "\xc0\x80", false},
		{"an overlong three-byte form", "\xe0\x80\xaf", false},
		{"a UTF-16 surrogate half", "\xed\xa0\x80", false},
		{"a surrogate pair encoded as two halves", "\xed\xa0\xbd\xed\xb8\x80", false},
		{"a code point past U+10FFFF", "\xf4\x90\x80\x80", false},

		{"NUL", "a\x00b", false},
		{"a tab", "a\tb", false},
		{"a line feed", "a\nb", false},
		{"a carriage return", "a\rb", false},
		{"an escape (terminal control sequences)", "a\x1b[2Jb", false},
		{"DEL", "a\x7fb", false},
		{"NEL (C1)", "a\u0085b", false},
		{"CSI (C1)", "a\u009bb", false},
		{"RIGHT-TO-LEFT OVERRIDE", "invoice\u202Efdp.exe", false},
		{"LEFT-TO-RIGHT EMBEDDING", "a\u202Ab", false},
		{"POP DIRECTIONAL FORMATTING", "a\u202Cb", false},
		{"RIGHT-TO-LEFT ISOLATE", "a\u2067b", false},
		{"POP DIRECTIONAL ISOLATE", "a\u2069b", false},
	}
	for _, tt := range tests {
		if got := ValidText(tt.s); got != tt.want {
			t.Errorf("ValidText(%q) (%s) = %v, want %v", tt.s, tt.name, got, tt.want)
		}
	}
}

// TestValidTextEveryCodePoint checks ValidText against its definition for
// every code point alone and between letters: valid unless a surrogate, a
// control character (Cc) or a bidirectional embedding, override or
// isolate.
func TestValidTextEveryCodePoint(t *testing.T) {
	t.Parallel()
	for r := rune(0); r <= unicode.MaxRune; r++ {
		want := utf8.ValidRune(r) && !unicode.Is(unicode.Cc, r) &&
			!(r >= 0x202a && r <= 0x202e) && !(r >= 0x2066 && r <= 0x2069)
		s := string(r)
		if !utf8.ValidRune(r) {
			// string(r) would give U+FFFD; write the raw encoding.
			s = string([]byte{0xed, 0xa0 | byte(r>>6&0x1f), 0x80 | byte(r&0x3f)})
		}
		if got := ValidText(s); got != want {
			t.Fatalf("ValidText(U+%04X) = %v, want %v", r, got, want)
		}
		if got := ValidText("a" + s + "b"); got != want {
			t.Fatalf("ValidText(a U+%04X b) = %v, want %v", r, got, want)
		}
	}
}

// FuzzValidText checks that text ValidText accepts is what the storage
// schema can encode: a record holding it marshals, and reads back equal.
func FuzzValidText(f *testing.F) {
	for _, s := range []string{"", "a", "\xff", "\x00", "\xc0\xaf", "\xed\xa0\x80", "\u202e", "résumé", "\u0085", "\xf4\x90\x80\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !ValidText(s) {
			return
		}
		if !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl) {
			t.Fatalf("ValidText(%q) accepted invalid UTF-8 or a control character", s)
		}
		b, err := proto.Marshal(&storagev1.Event{Reason: s, Message: s, Principal: s})
		if err != nil {
			t.Fatalf("ValidText(%q) accepted text the store cannot encode: %v", s, err)
		}
		var ev storagev1.Event
		if err := proto.Unmarshal(b, &ev); err != nil || ev.GetMessage() != s {
			t.Fatalf("read back %q, %v; want %q", ev.GetMessage(), err, s)
		}
	})
}

func TestValidRequestID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id   string
		want bool
	}{
		{"cli-5f2c9a1b00e4d1c2a3b4c5d6-0", true},
		{"0b8e5f0e-7d1c-4e8e-9f3a-2d4b6c8a0e1f", true},
		{"after a cancel with reason %FF", true},
		{"résumé-1", true},
		{strings.Repeat("r", MaxRequestIDBytes), true},
		{"", false},
		{strings.Repeat("r", MaxRequestIDBytes+1), false},
		{strings.Repeat("é", MaxRequestIDBytes/2+1), false},
		{"tab\there", false},
		{"nul\x00", false},
		{"del\x7f", false},
		{"\xff", false},
		{"a\u202eb", false},
	}
	for _, tt := range tests {
		if got := ValidRequestID(tt.id); got != tt.want {
			t.Errorf("ValidRequestID(%q) = %v, want %v", tt.id, got, tt.want)
		}
	}
}
