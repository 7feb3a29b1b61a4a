package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/leasehold/leasehold/client"
	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// app is what a running subcommand works with.
type app struct {
	env Env
	g   globalOpts
	c   *client.Client
	out io.Writer
}

// jsonOutput reports whether -o json was given.
func (a *app) jsonOutput() bool { return a.g.Output == "json" }

// jsonMarshal is the one JSON encoding of API messages: proto field names
// (snake_case), unset fields omitted.
var jsonMarshal = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: false}

// printJSON writes m as one line of compact JSON.
func (a *app) printJSON(m proto.Message) error {
	b, err := jsonMarshal.Marshal(m)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", m.ProtoReflect().Descriptor().Name(), err)
	}
	return writeJSONLine(a.out, b)
}

// printJSONValue writes a plain Go value as one line of JSON.
func (a *app) printJSONValue(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding output: %w", err)
	}
	return writeJSONLine(a.out, b)
}

// writeJSONLine compacts b (protojson varies its spacing on purpose) and
// writes it with a newline.
func writeJSONLine(w io.Writer, b []byte) error {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return fmt.Errorf("encoding output: %w", err)
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// newTable returns a tab-separated column writer; Flush it when done.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// shortEnum strips an enum value's type prefix ("PHASE_QUEUED" -> "QUEUED")
// and shows the unspecified value as "-".
func shortEnum(name, prefix string) string {
	s := strings.TrimPrefix(name, prefix)
	if s == "UNSPECIFIED" || s == "" {
		return "-"
	}
	return s
}

func phaseName(p leaseholdv1.Phase) string { return shortEnum(p.String(), "PHASE_") }

func reasonName(r leaseholdv1.TerminalReason) string {
	return shortEnum(r.String(), "TERMINAL_REASON_")
}

func kindName(k leaseholdv1.EventKind) string { return shortEnum(k.String(), "EVENT_KIND_") }

func actionName(a leaseholdv1.ReplayAction) string {
	return shortEnum(a.String(), "REPLAY_ACTION_")
}

// parsePhase accepts a phase in any case, with or without its prefix.
func parsePhase(s string) (leaseholdv1.Phase, error) {
	n := strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(n, "PHASE_") {
		n = "PHASE_" + n
	}
	v, ok := leaseholdv1.Phase_value[n]
	if !ok || v == 0 {
		return 0, usagef("unknown phase %q (want one of QUEUED, LEASED, RETRY_WAIT, SUCCEEDED, FAILED, CANCELLED)", s)
	}
	return leaseholdv1.Phase(v), nil
}

// parseTerminalReason accepts a terminal reason in any case, with or without its prefix.
func parseTerminalReason(s string) (leaseholdv1.TerminalReason, error) {
	n := strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(n, "TERMINAL_REASON_") {
		n = "TERMINAL_REASON_" + n
	}
	v, ok := leaseholdv1.TerminalReason_value[n]
	if !ok || v == 0 {
		return 0, usagef("unknown terminal reason %q (want one of UNSUPPORTED_FORMAT, INVALID_DOCUMENT, ATTEMPTS_EXHAUSTED, ...)", s)
	}
	return leaseholdv1.TerminalReason(v), nil
}

// formatTime shows a timestamp in UTC, or "-" when unset.
func formatTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339Nano)
}

// orDash shows an empty string as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// attemptString shows "attempt/max", or just the attempt when max is unknown.
func attemptString(attempt, maxAttempts uint32) string {
	if maxAttempts == 0 {
		return fmt.Sprint(attempt)
	}
	return fmt.Sprintf("%d/%d", attempt, maxAttempts)
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

// Set appends one value, or several separated by commas.
func (l *stringList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// byteSize is a flag holding a number of bytes, written as a plain number
// or with a unit: 16MiB, 256KiB, 1GiB (powers of 1024) or 5MB, 200KB, 1GB
// (powers of 1000).
type byteSize int64

// byteUnits are the suffixes byteSize accepts, longest first.
var byteUnits = []struct {
	suffix string
	factor int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1},
}

// String shows the size in the largest binary unit that divides it.
func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []struct {
		suffix string
		factor int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.factor == 0 {
			return strconv.FormatInt(n/u.factor, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// Set parses a size such as 16MiB.
func (b *byteSize) Set(v string) error {
	s := strings.TrimSpace(v)
	factor := int64(1)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, factor = strings.TrimSpace(rest), u.factor
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/factor {
		return fmt.Errorf("%q is not a size such as 16MiB, 500KB or 1048576", v)
	}
	*b = byteSize(n * factor)
	return nil
}

// countsOf returns a batch's count per phase.
func countsOf(b *leaseholdv1.Batch) map[leaseholdv1.Phase]uint32 {
	m := map[leaseholdv1.Phase]uint32{}
	for _, c := range b.GetCounts() {
		m[c.GetPhase()] += c.GetCount()
	}
	return m
}

// printAll writes up to limit (0: all) records from seq: one JSON object per
// line with -o json, otherwise a table under header with one row per record
// (row returns the tab-separated cells).
func printAll[M proto.Message](a *app, seq iter.Seq2[M, error], limit int, header string, row func(M) string) error {
	t := newTable(a.out)
	if !a.jsonOutput() {
		fmt.Fprintln(t, header)
	}
	n := 0
	for m, err := range seq {
		if err != nil {
			t.Flush()
			return err
		}
		if a.jsonOutput() {
			if err := a.printJSON(m); err != nil {
				return err
			}
		} else {
			fmt.Fprintln(t, row(m))
		}
		n++
		if limit > 0 && n >= limit {
			break
		}
	}
	return t.Flush()
}
