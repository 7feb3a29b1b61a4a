package jobs

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// smallLimits keep the boundary cases a few bytes long.
var smallLimits = Limits{
	MaxDocuments:        3,
	MaxDocumentBytes:    100,
	MaxBatchBytes:       250,
	MaxInlineBytes:      10,
	MaxBatchInlineBytes: 25,
	MaxNameBytes:        16,
	MaxAttempts:         5,
}

// doc returns a valid document by reference, named name, declaring size.
func doc(name string, size int64) DocInput {
	return DocInput{Document: Document{Name: name, ContentType: "application/pdf", SizeBytes: size, SourceURI: "s3://bucket/" + name}}
}

// inline returns a valid document carrying content inline.
func inline(name string, content string) DocInput {
	return DocInput{Document: Document{Name: name, ContentType: "text/plain"}, Content: []byte(content)}
}

func docs(ds ...DocInput) []DocInput { return ds }

func TestValidateBatch(t *testing.T) {
	type violation struct{ Field, Reason string }
	tests := []struct {
		name       string
		team       string
		requestID  string
		docs       []DocInput
		policy     PolicyInput
		wantReason string
		want       []violation
	}{
		{name: "A batch at every limit is valid", docs: docs(doc("aaaaaaaaaaaaaaaa", 100), doc("b", 100), inline("c", "0123456789")), policy: PolicyInput{MaxAttempts: 5}},

		{name: "MaxDocuments documents are accepted", docs: docs(doc("a", 1), doc("b", 1), doc("c", 1))},
		{name: "One document over MaxDocuments is refused", docs: docs(doc("a", 1), doc("b", 1), doc("c", 1), doc("d", 1)),
			wantReason: "BATCH_TOO_LARGE", want: []violation{{"documents", "BATCH_TOO_LARGE"}}},

		{name: "A document of MaxDocumentBytes is accepted", docs: docs(doc("a", 100))},
		{name: "A document one byte over MaxDocumentBytes is refused", docs: docs(doc("a", 101)),
			wantReason: "DOCUMENT_TOO_LARGE", want: []violation{{"documents[0].size_bytes", "DOCUMENT_TOO_LARGE"}}},

		{name: "A batch of MaxBatchBytes is accepted", docs: docs(doc("a", 100), doc("b", 100), doc("c", 50))},
		{name: "A batch one byte over MaxBatchBytes is refused", docs: docs(doc("a", 100), doc("b", 100), doc("c", 51)),
			wantReason: "BATCH_TOO_LARGE", want: []violation{{"documents", "BATCH_TOO_LARGE"}}},

		{name: "Inline content of MaxInlineBytes is accepted", docs: docs(inline("a", "0123456789"))},
		{name: "Inline content one byte over MaxInlineBytes is refused", docs: docs(inline("a", "0123456789X")),
			wantReason: "CONTENT_TOO_LARGE", want: []violation{{"documents[0].content", "CONTENT_TOO_LARGE"}}},

		{name: "Inline content of MaxBatchInlineBytes across the batch is accepted", docs: docs(inline("a", "0123456789"), inline("b", "0123456789"), inline("c", "01234"))},
		{name: "Inline content one byte over MaxBatchInlineBytes across the batch is refused whole", docs: docs(inline("a", "0123456789"), inline("b", "0123456789"), inline("c", "012345")),
			wantReason: "BATCH_TOO_LARGE", want: []violation{{"documents", "BATCH_TOO_LARGE"}}},
		{name: "Inline bytes count only inline content, not sizes declared by reference", docs: docs(inline("a", "0123456789"), inline("b", "0123456789"), doc("c", 100))},

		{name: "A name of MaxNameBytes is accepted", docs: docs(doc("0123456789abcdef", 1))},
		{name: "A name one byte over MaxNameBytes is refused", docs: docs(doc("0123456789abcdefg", 1)),
			wantReason: "INVALID_NAME", want: []violation{{"documents[0].name", "INVALID_NAME"}}},
		{name: "A multi-byte name is measured in bytes", docs: docs(doc(strings.Repeat("é", 9), 1)),
			wantReason: "INVALID_NAME", want: []violation{{"documents[0].name", "INVALID_NAME"}}},
		{name: "An empty name is refused", docs: docs(doc("", 1)),
			wantReason: "INVALID_NAME", want: []violation{{"documents[0].name", "INVALID_NAME"}}},
		{name: "A name with a control character is refused", docs: docs(DocInput{Document: Document{Name: "a\nb", SourceURI: "s3://a"}}),
			wantReason: "INVALID_NAME", want: []violation{{"documents[0].name", "INVALID_NAME"}}},
		{name: "A name with a right-to-left override is refused", docs: docs(DocInput{Document: Document{Name: "a\u202Efdp.exe", SourceURI: "s3://a"}}),
			wantReason: "INVALID_NAME", want: []violation{{"documents[0].name", "INVALID_NAME"}}},
		{name: "A name that is not UTF-8 is refused", docs: docs(DocInput{Document: Document{Name: "a\xffb", SourceURI: "s3://a"}}),
			wantReason: "INVALID_NAME", want: []violation{{"documents[0].name", "INVALID_NAME"}}},

		{name: "An empty batch is refused", docs: nil,
			wantReason: "EMPTY_BATCH", want: []violation{{"documents", "EMPTY_BATCH"}}},

		{name: "Every repeat of a name is refused, the first use is not", docs: docs(doc("a", 1), doc("a", 1), doc("a", 1)),
			wantReason: "DUPLICATE_NAME", want: []violation{{"documents[1].name", "DUPLICATE_NAME"}, {"documents[2].name", "DUPLICATE_NAME"}}},

		{name: "A team with upper case and spaces is refused", team: "Team A", docs: docs(doc("a", 1)),
			wantReason: "INVALID_TEAM", want: []violation{{"team", "INVALID_TEAM"}}},
		{name: "An empty team is refused", team: "-", docs: docs(doc("a", 1)),
			wantReason: "INVALID_TEAM", want: []violation{{"team", "INVALID_TEAM"}}},
		{name: "A team of 64 bytes is accepted", team: strings.Repeat("t", 64), docs: docs(doc("a", 1))},
		{name: "A team of 65 bytes is refused", team: strings.Repeat("t", 65), docs: docs(doc("a", 1)),
			wantReason: "INVALID_TEAM", want: []violation{{"team", "INVALID_TEAM"}}},

		{name: "A missing request id is refused", requestID: "-", docs: docs(doc("a", 1)),
			wantReason: "MISSING_REQUEST_ID", want: []violation{{"request_id", "MISSING_REQUEST_ID"}}},
		{name: "A request id of 128 bytes is accepted", requestID: strings.Repeat("r", 128), docs: docs(doc("a", 1))},
		{name: "A request id of 129 bytes is refused", requestID: strings.Repeat("r", 129), docs: docs(doc("a", 1)),
			wantReason: "INVALID_REQUEST_ID", want: []violation{{"request_id", "INVALID_REQUEST_ID"}}},
		{name: "A request id that is not UTF-8 is refused", requestID: "req\xff", docs: docs(doc("a", 1)),
			wantReason: "INVALID_REQUEST_ID", want: []violation{{"request_id", "INVALID_REQUEST_ID"}}},
		{name: "A request id with a NUL is refused", requestID: "req\x00", docs: docs(doc("a", 1)),
			wantReason: "INVALID_REQUEST_ID", want: []violation{{"request_id", "INVALID_REQUEST_ID"}}},
		{name: "A request id with a tab is refused", requestID: "req\t1", docs: docs(doc("a", 1)),
			wantReason: "INVALID_REQUEST_ID", want: []violation{{"request_id", "INVALID_REQUEST_ID"}}},
		{name: "A request id with spaces is accepted", requestID: "nightly import 1", docs: docs(doc("a", 1))},

		{name: "A document with neither content nor source is refused", docs: docs(DocInput{Document: Document{Name: "a", SizeBytes: 5}}),
			wantReason: "MISSING_CONTENT", want: []violation{{"documents[0].content", "MISSING_CONTENT"}}},
		{name: "A declared size smaller than the inline content is refused", docs: docs(DocInput{Document: Document{Name: "a", SizeBytes: 3}, Content: []byte("12345")}),
			wantReason: "INVALID_SIZE", want: []violation{{"documents[0].size_bytes", "INVALID_SIZE"}}},
		{name: "A declared size equal to the inline content is accepted", docs: docs(DocInput{Document: Document{Name: "a", SizeBytes: 5}, Content: []byte("12345")})},
		{name: "A negative size is refused", docs: docs(doc("a", -1)),
			wantReason: "INVALID_SIZE", want: []violation{{"documents[0].size_bytes", "INVALID_SIZE"}}},
		{name: "A source URI with a control character is refused", docs: docs(DocInput{Document: Document{Name: "a", SourceURI: "s3://x\x00"}}),
			wantReason: "INVALID_SOURCE_URI", want: []violation{{"documents[0].source_uri", "INVALID_SOURCE_URI"}}},
		{name: "A content type that is not UTF-8 is refused", docs: docs(DocInput{Document: Document{Name: "a", ContentType: "x\xff", SourceURI: "s3://a"}}),
			wantReason: "INVALID_CONTENT_TYPE", want: []violation{{"documents[0].content_type", "INVALID_CONTENT_TYPE"}}},
		{name: "A content type with a NUL is refused", docs: docs(DocInput{Document: Document{Name: "a", ContentType: "text/plain\x00", SourceURI: "s3://a"}}),
			wantReason: "INVALID_CONTENT_TYPE", want: []violation{{"documents[0].content_type", "INVALID_CONTENT_TYPE"}}},
		{name: "A source URI that is not UTF-8 is refused", docs: docs(DocInput{Document: Document{Name: "a", SourceURI: "s3://\xc0\xaf"}}),
			wantReason: "INVALID_SOURCE_URI", want: []violation{{"documents[0].source_uri", "INVALID_SOURCE_URI"}}},

		{name: "A retry policy at the attempt bound is accepted", docs: docs(doc("a", 1)), policy: PolicyInput{MaxAttempts: 5, BackoffBase: time.Millisecond, BackoffCap: 24 * time.Hour}},
		{name: "A retry policy over the attempt bound is refused", docs: docs(doc("a", 1)), policy: PolicyInput{MaxAttempts: 6},
			wantReason: "INVALID_RETRY_POLICY", want: []violation{{"retry_policy.max_attempts", "INVALID_RETRY_POLICY"}}},
		{name: "A backoff base under a millisecond is refused", docs: docs(doc("a", 1)), policy: PolicyInput{BackoffBase: time.Millisecond - 1},
			wantReason: "INVALID_RETRY_POLICY", want: []violation{{"retry_policy.backoff_base", "INVALID_RETRY_POLICY"}}},
		{name: "A backoff cap over a day is refused", docs: docs(doc("a", 1)), policy: PolicyInput{BackoffCap: 24*time.Hour + 1},
			wantReason: "INVALID_RETRY_POLICY", want: []violation{{"retry_policy.backoff_cap", "INVALID_RETRY_POLICY"}}},
		{name: "A backoff cap under the base is refused", docs: docs(doc("a", 1)), policy: PolicyInput{BackoffBase: time.Minute, BackoffCap: time.Second},
			wantReason: "INVALID_RETRY_POLICY", want: []violation{{"retry_policy.backoff_cap", "INVALID_RETRY_POLICY"}}},

		{
			name: "Several offending documents are each named once",
			docs: docs(doc("big", 101), doc("ok", 1), DocInput{Document: Document{Name: "none"}}),
			// 101 + 1 + 0 stays under MaxBatchBytes.
			wantReason: "DOCUMENT_TOO_LARGE",
			want: []violation{
				{"documents[0].size_bytes", "DOCUMENT_TOO_LARGE"},
				{"documents[2].content", "MISSING_CONTENT"},
			},
		},
		{
			name: "The reason is the first violation's and every violation is listed",
			team: "BAD", requestID: "-",
			docs:       docs(doc("0123456789abcdefg", 1), inline("c", "0123456789X"), doc("0123456789abcdefg", 1)),
			policy:     PolicyInput{MaxAttempts: 99},
			wantReason: "INVALID_TEAM",
			want: []violation{
				{"team", "INVALID_TEAM"},
				{"request_id", "MISSING_REQUEST_ID"},
				{"retry_policy.max_attempts", "INVALID_RETRY_POLICY"},
				{"documents[0].name", "INVALID_NAME"},
				{"documents[1].content", "CONTENT_TOO_LARGE"},
				{"documents[2].name", "INVALID_NAME"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			team, reqID := tt.team, tt.requestID
			switch team {
			case "":
				team = "team-a"
			case "-":
				team = ""
			}
			switch reqID {
			case "":
				reqID = "req-1"
			case "-":
				reqID = ""
			}
			err := ValidateBatch(team, reqID, tt.docs, tt.policy, smallLimits)
			if tt.wantReason == "" {
				if err != nil {
					t.Fatalf("ValidateBatch = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidBatch) {
				t.Fatalf("ValidateBatch = %v, want errors.Is ErrInvalidBatch", err)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("ValidateBatch error %T is not a *ValidationError", err)
			}
			if string(ve.Reason) != tt.wantReason {
				t.Errorf("Reason = %q, want %q", ve.Reason, tt.wantReason)
			}
			got := make([]violation, len(ve.Violations))
			for i, v := range ve.Violations {
				got[i] = violation{v.Field, string(v.Reason)}
				if v.Description == "" {
					t.Errorf("violation %s has no description", v.Field)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("violations mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestValidationErrorMessage(t *testing.T) {
	err := ValidateBatch("BAD", "", docs(doc("a", 1)), PolicyInput{}, smallLimits)
	if err == nil {
		t.Fatal("ValidateBatch = nil, want an error")
	}
	msg := err.Error()
	for _, want := range []string{"invalid batch", "INVALID_TEAM", "(and 1 more)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error message %q does not contain %q", msg, want)
		}
	}
}

func TestZeroLimitsTakeTheDefaults(t *testing.T) {
	want := Limits{
		MaxDocuments: DefaultMaxDocuments, MaxDocumentBytes: DefaultMaxDocumentBytes,
		MaxBatchBytes: DefaultMaxBatchBytes, MaxInlineBytes: DefaultMaxInlineBytes, MaxBatchInlineBytes: DefaultMaxBatchInline,
		MaxNameBytes: DefaultMaxNameBytes, MaxTeamQueue: DefaultMaxTeamQueue, MaxAttempts: DefaultMaxAttemptsBound,
	}
	if diff := cmp.Diff(want, Limits{}.WithDefaults()); diff != "" {
		t.Errorf("Limits{}.WithDefaults() mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(smallLimits.WithDefaults().MaxDocuments, 3); diff != "" {
		t.Errorf("a set limit was replaced by its default: %s", diff)
	}
	many := make([]DocInput, DefaultMaxDocuments+1)
	for i := range many {
		many[i] = doc("d"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('a'+i/26)), 1)
	}
	if err := ValidateBatch("team", "r", many[:DefaultMaxDocuments], PolicyInput{}, Limits{}); err != nil {
		t.Errorf("ValidateBatch of %d documents with default limits = %v, want nil", DefaultMaxDocuments, err)
	}
	var ve *ValidationError
	if err := ValidateBatch("team", "r", many, PolicyInput{}, Limits{}); !errors.As(err, &ve) || ve.Reason != "BATCH_TOO_LARGE" {
		t.Errorf("ValidateBatch of %d documents with default limits = %v, want BATCH_TOO_LARGE", len(many), err)
	}
}

func TestDefaultBatchInlineLimit(t *testing.T) {
	// DefaultMaxBatchInline is a whole number of documents at
	// DefaultMaxInlineBytes, so the boundary is reached with documents that
	// each respect their own limit.
	full := make([]byte, DefaultMaxInlineBytes)
	n := DefaultMaxBatchInline / DefaultMaxInlineBytes
	atLimit := make([]DocInput, n)
	for i := range atLimit {
		atLimit[i] = DocInput{Document: Document{Name: fmt.Sprintf("d%03d.txt", i), ContentType: "text/plain"}, Content: full}
	}
	t.Run("A batch carrying exactly DefaultMaxBatchInline bytes inline is accepted", func(t *testing.T) {
		if err := ValidateBatch("team", "r", atLimit, PolicyInput{}, Limits{}); err != nil {
			t.Fatalf("ValidateBatch = %v, want nil", err)
		}
	})
	t.Run("One more inline byte refuses the whole batch BATCH_TOO_LARGE", func(t *testing.T) {
		over := append(slices.Clone(atLimit), inline("extra.txt", "x"))
		err := ValidateBatch("team", "r", over, PolicyInput{}, Limits{})
		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("ValidateBatch = %v, want a *ValidationError", err)
		}
		got := make([]string, len(ve.Violations))
		for i, v := range ve.Violations {
			got[i] = v.Field + " " + string(v.Reason)
		}
		if diff := cmp.Diff([]string{"documents BATCH_TOO_LARGE"}, got); diff != "" {
			t.Errorf("violations (-want +got):\n%s", diff)
		}
		if want := fmt.Sprint(DefaultMaxBatchInline + 1); !strings.Contains(ve.Violations[0].Description, want) {
			t.Errorf("description %q does not name the %s bytes carried", ve.Violations[0].Description, want)
		}
	})
}

func TestPolicyInputOverridesDefaults(t *testing.T) {
	def := RetryPolicy{MaxAttempts: 5, BackoffBase: time.Second, BackoffCap: 5 * time.Minute}
	tests := []struct {
		name string
		in   PolicyInput
		want RetryPolicy
	}{
		{"No override keeps the defaults", PolicyInput{}, def},
		{"Each set field replaces its default", PolicyInput{MaxAttempts: 2, BackoffBase: time.Millisecond, BackoffCap: time.Second}, RetryPolicy{2, time.Millisecond, time.Second}},
		{"A base over the default cap raises the cap to the base", PolicyInput{BackoffBase: time.Hour}, RetryPolicy{5, time.Hour, time.Hour}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.in.Policy(def)); diff != "" {
				t.Errorf("Policy mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 5, BackoffBase: time.Second, BackoffCap: 5 * time.Minute}
	tests := []struct {
		name   string
		policy RetryPolicy
		n      uint32
		jitter float64
		want   time.Duration
	}{
		{"The first retry waits up to the base", p, 1, 0.5, 500 * time.Millisecond},
		{"Each attempt doubles the ceiling", p, 3, 0.5, 2 * time.Second},
		{"The ceiling stops at the cap", p, 10, 0.5, 150 * time.Second},
		{"A zero jitter waits not at all", p, 4, 0, 0},
		{"A huge attempt number that overflows the shift waits up to the cap", p, 40, 0.5, 150 * time.Second},
		{"Attempt 63 is past the shift and waits up to the cap", p, 63, 0.5, 150 * time.Second},
		{"The largest attempt number waits up to the cap", p, math.MaxUint32, 0.5, 150 * time.Second},
		{"Jitter below zero is clamped to zero", p, 2, -3, 0},
		{"Jitter above one is clamped to the ceiling", p, 2, 7, 2 * time.Second},
		{"A cap below the base bounds the first wait", RetryPolicy{BackoffBase: time.Minute, BackoffCap: time.Second}, 1, 0.5, 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.policy.Backoff(tt.n, tt.jitter); got != tt.want {
				t.Errorf("Backoff(%d, %v) = %v, want %v", tt.n, tt.jitter, got, tt.want)
			}
		})
	}
}

// backoffCeiling returns min(cap, base * 2^(n-1)) without overflow.
func backoffCeiling(base, cap time.Duration, n uint32) time.Duration {
	k := n - 1
	if k >= 63 {
		return cap
	}
	if hi, lo := bits.Mul64(uint64(base), 1<<k); hi != 0 || lo > uint64(cap) {
		return cap
	}
	return base << k
}

func TestBackoffStaysWithinItsCeiling(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base := time.Duration(rapid.Int64Range(1, int64(24*time.Hour)).Draw(t, "base"))
		cap := time.Duration(rapid.Int64Range(int64(base), int64(24*time.Hour)).Draw(t, "cap"))
		n := rapid.OneOf(rapid.Uint32Range(1, 70), rapid.Uint32Min(1)).Draw(t, "n")
		jitter := jitterGen.Draw(t, "jitter")
		got := RetryPolicy{BackoffBase: base, BackoffCap: cap}.Backoff(n, jitter)
		ceiling := backoffCeiling(base, cap, n)
		if got < 0 || got > ceiling {
			t.Fatalf("Backoff(%d, %v) with base %v cap %v = %v, want within [0, %v]", n, jitter, base, cap, got, ceiling)
		}
	})
}

func TestFormatsUnsupported(t *testing.T) {
	f := NewFormats(append([]string{"  .XYZM ", "", "Application/X-Evil"}, DefaultUnsupported...))
	tests := []struct {
		name string
		doc  Document
		want bool
	}{
		{"A macro-enabled extension is unsupported", Document{Name: "budget.xlsm"}, true},
		{"The extension matches case-insensitively", Document{Name: "BUDGET.XLSM"}, true},
		{"A listed entry with spaces and capitals is normalised", Document{Name: "memo.xyzm"}, true},
		{"A listed MIME type is unsupported", Document{Name: "file", ContentType: "application/x-msdownload"}, true},
		{"The MIME type matches case-insensitively", Document{Name: "file", ContentType: "APPLICATION/VND.MS-WORD.DOCUMENT.MACROENABLED.12"}, true},
		{"The MIME type is trimmed", Document{Name: "file", ContentType: " application/x-evil "}, true},
		{"An unsupported MIME type wins over a harmless name", Document{Name: "notes.pdf", ContentType: "application/x-msdos-program"}, true},
		{"An unsupported extension wins over a harmless MIME type", Document{Name: "run.exe", ContentType: "application/pdf"}, true},
		{"Only the last extension counts", Document{Name: "archive.exe.pdf", ContentType: "application/pdf"}, false},
		{"A PDF is supported", Document{Name: "report.pdf", ContentType: "application/pdf"}, false},
		{"A name without extension is supported", Document{Name: "README"}, false},
		{"An extension-like name without a dot is supported", Document{Name: "docm"}, false},
		{"An empty document is supported", Document{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := f.Unsupported(tt.doc); got != tt.want {
				t.Errorf("Unsupported(%+v) = %v, want %v", tt.doc, got, tt.want)
			}
		})
	}
	if len(f) != len(DefaultUnsupported)+2 {
		t.Errorf("NewFormats kept %d entries, want %d (blank entries dropped)", len(f), len(DefaultUnsupported)+2)
	}
}

func TestValidTeam(t *testing.T) {
	for _, team := range []string{"a", "team-a", "team_a", "t3am", strings.Repeat("z", 64)} {
		if !ValidTeam(team) {
			t.Errorf("ValidTeam(%q) = false, want true", team)
		}
	}
	for _, team := range []string{"", "Team", "team a", "team/a", "tëam", strings.Repeat("z", 65)} {
		if ValidTeam(team) {
			t.Errorf("ValidTeam(%q) = true, want false", team)
		}
	}
}

func FuzzValidateBatch(f *testing.F) {
	f.Add("team-a", "req-1", "a.pdf", "application/pdf", int64(10), "s3://b/a", []byte(nil), "b.pdf", uint32(3), int64(time.Second), int64(time.Minute))
	f.Add("", "", "", "", int64(-1), "", []byte("x"), "", uint32(99), int64(1), int64(-5))
	f.Add("team", "r", "dup", "x\xff", int64(3), "\x00", []byte("12345"), "dup", uint32(0), int64(0), int64(0))
	f.Add("t", strings.Repeat("r", 200), strings.Repeat("n", 300), "text/plain", int64(math.MaxInt64), "s3://x", []byte("0123456789X"), "m", uint32(math.MaxUint32), int64(math.MinInt64), int64(math.MaxInt64))
	f.Add("team-a", "req-2", "big.txt", "text/plain", int64(0), "", []byte(strings.Repeat("z", 26)), "b.txt", uint32(1), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, team, reqID, name, ctype string, size int64, uri string, content []byte, name2 string, attempts uint32, base, cap int64) {
		ds := []DocInput{
			{Document: Document{Name: name, ContentType: ctype, SizeBytes: size, SourceURI: uri}, Content: content},
			{Document: Document{Name: name2, SizeBytes: size / 2, SourceURI: uri}},
		}
		policy := PolicyInput{MaxAttempts: attempts, BackoffBase: time.Duration(base), BackoffCap: time.Duration(cap)}
		for _, d := range [][]DocInput{nil, ds[:1], ds} {
			err := ValidateBatch(team, reqID, d, policy, smallLimits)
			var inline int64
			for _, di := range d {
				inline += int64(len(di.Content))
			}
			if err == nil {
				if inline > smallLimits.MaxBatchInlineBytes {
					t.Fatalf("ValidateBatch accepted %d bytes inline, over %d", inline, smallLimits.MaxBatchInlineBytes)
				}
				if !ValidTeam(team) || !ValidRequestID(reqID) {
					t.Fatalf("ValidateBatch accepted team %q, request id %q", team, reqID)
				}
				for _, di := range d {
					if !ValidText(di.Name) || !ValidText(di.ContentType) || !ValidText(di.SourceURI) {
						t.Fatalf("ValidateBatch accepted a document with text it may not store: name %q, content type %q, source %q", di.Name, di.ContentType, di.SourceURI)
					}
				}
				continue
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, ErrInvalidBatch) {
				t.Fatalf("ValidateBatch = %v (%T), want a *ValidationError wrapping ErrInvalidBatch", err, err)
			}
			if inline > smallLimits.MaxBatchInlineBytes && !slices.ContainsFunc(ve.Violations, func(v Violation) bool {
				return v.Field == "documents" && v.Reason == "BATCH_TOO_LARGE"
			}) {
				t.Fatalf("%d bytes inline, over %d, without a BATCH_TOO_LARGE violation: %v", inline, smallLimits.MaxBatchInlineBytes, err)
			}
			if len(ve.Violations) == 0 {
				t.Fatalf("ValidationError without violations: %v", err)
			}
			if ve.Reason != ve.Violations[0].Reason {
				t.Fatalf("Reason %q is not the first violation's %q", ve.Reason, ve.Violations[0].Reason)
			}
			_ = ve.Error()
		}
		_ = NewFormats(DefaultUnsupported).Unsupported(ds[0].Document)
	})
}

func TestPreviewMediaType(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"image/png": "image/png", "IMAGE/PNG": "image/png", " image/jpeg ": "image/jpeg",
		"image/gif; x=y": "image/gif", "image/WebP": "image/webp",
	} {
		if got, err := PreviewMediaType(in); err != nil || got != want {
			t.Errorf("PreviewMediaType(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "image/png,text/html", "image/png; charset=utf-8,text/html", "image/SVG+xml",
		"text/html", "image/", "image/png;a", "image/bmp", "image/png" + strings.Repeat(" ", 256)} {
		if got, err := PreviewMediaType(in); !errors.Is(err, ErrPreviewType) {
			t.Errorf("PreviewMediaType(%q) = %q, %v; want ErrPreviewType", in, got, err)
		}
		if got := ServedPreviewType(in); got != OpaquePreviewType {
			t.Errorf("ServedPreviewType(%q) = %q, want %q", in, got, OpaquePreviewType)
		}
	}
}
