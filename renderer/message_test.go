package renderer

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// TestFailureMessage checks that an error's text becomes a message the
// coordinator stores: UTF-8, no control or bidirectional formatting
// character, within the bound and cut between characters.
func TestFailureMessage(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"format \"docm\" is not supported", "format \"docm\" is not supported"},
		{"first\nsecond", "first second"},
		{"tab\there\r\n", "tab here  "},
		{"a\x00b\x1b[2Jc", "a b [2Jc"},
		{"bad \xff byte", "bad   byte"},
		{"a\u202eb\u2066c", "a b c"},
		{"résumé 報告", "résumé 報告"},
		{strings.Repeat("a", maxFailureMessage+10), strings.Repeat("a", maxFailureMessage)},
		{strings.Repeat("a", maxFailureMessage-1) + "é", strings.Repeat("a", maxFailureMessage-1)},
	}
	for _, tt := range tests {
		got := failureMessage(tt.in)
		if got != tt.want {
			t.Errorf("failureMessage(%.40q) = %.40q, want %.40q", tt.in, got, tt.want)
		}
		if !utf8.ValidString(got) || strings.ContainsFunc(got, unicode.IsControl) || len(got) > maxFailureMessage {
			t.Errorf("failureMessage(%.40q) = %.40q: not text within %d bytes", tt.in, got, maxFailureMessage)
		}
	}
}
