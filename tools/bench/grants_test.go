package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)

func TestSplitLines(t *testing.T) {
	t.Parallel()
	lines, rest := splitLines([]byte("j-1 10\nj-2 11\nj-3"))
	got := []string{}
	for _, l := range lines {
		got = append(got, string(l))
	}
	if diff := cmp.Diff([]string{"j-1 10", "j-2 11"}, got); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	if string(rest) != "j-3" {
		t.Errorf("rest = %q, want \"j-3\"", rest)
	}
}

func TestParseGrantLine(t *testing.T) {
	t.Parallel()
	id, token, err := parseGrantLine([]byte("j-42 1234"))
	if err != nil || id != "j-42" || token != 1234 {
		t.Errorf("parseGrantLine = %q, %d, %v; want j-42, 1234, nil", id, token, err)
	}
	for _, bad := range []string{"", "j-1", "j-1 x", "j-1 2 3"} {
		if _, _, err := parseGrantLine([]byte(bad)); err == nil {
			t.Errorf("parseGrantLine(%q): no error", bad)
		}
	}
}

func TestGrantLogSeesAppendedGrants(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "a.record"), filepath.Join(dir, "b.record")}
	g, err := newGrantLog(paths)
	if err != nil {
		t.Skip("inotify unavailable:", err)
	}
	defer g.close()
	f, err := os.OpenFile(paths[1], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	before := time.Now()
	// A line written in two parts counts once complete.
	if _, err := f.WriteString("j-7 3"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("\nj-8 4\n"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"j-8", "j-7"} {
		at, err := g.wait(ctx, id)
		if err != nil {
			t.Fatalf("wait(%s): %v", id, err)
		}
		if at.Before(before) {
			t.Errorf("%s arrived at %v, before it was written (%v)", id, at, before)
		}
	}
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelShort()
	if _, err := g.wait(short, "j-9"); err == nil {
		t.Error("wait for a grant never written returned no error")
	}
}
