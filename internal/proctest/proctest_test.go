package proctest

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestChildEnv(t *testing.T) {
	got := childEnv([]string{"PATH=/bin", "LEASEHOLD_TOKEN=x", "HOME=/root", "GOFAIL_FAILPOINTS=a=panic", "LEASEHOLD_LISTEN=1"},
		[]string{"GOFAIL_FAILPOINTS=b=panic"})
	want := []string{"PATH=/bin", "HOME=/root", "GOFAIL_FAILPOINTS=b=panic"}
	if !slices.Equal(got, want) {
		t.Errorf("childEnv = %q, want %q", got, want)
	}
}

func TestExec(t *testing.T) {
	t.Run("Stop ends a running process with SIGTERM and reports how it exited", func(t *testing.T) {
		log := filepath.Join(t.TempDir(), "child.log")
		p, err := Exec(Spec{Name: "sleeper", Path: "/bin/sh", Args: []string{"-c", "echo up; exec sleep 60"}, Env: []string{"MARK=1"}, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		if line, err := p.WaitLine(t.Context(), 0, []string{"up"}); err != nil || line != "up" {
			t.Fatalf("WaitLine = %q, %v; want up", line, err)
		}
		if p.HasExited() {
			t.Fatal("the process exited at once")
		}
		_, err = p.Stop(time.Minute)
		if err == nil || !strings.Contains(err.Error(), "terminated") {
			t.Errorf("Stop = %v, want the SIGTERM exit", err)
		}
		if !p.HasExited() {
			t.Error("HasExited is false after Stop")
		}
		if text := p.LogText(); !strings.HasPrefix(text, "# MARK=1 /bin/sh -c") || !strings.HasSuffix(text, "\nup\n") {
			t.Errorf("log = %q, want the command line, then the output", text)
		}
	})
	t.Run("An exit before Stop is reported to Unexpected, and Stop then answers nil", func(t *testing.T) {
		got := make(chan error, 1)
		p, err := Exec(Spec{Name: "quitter", Path: "/bin/sh", Args: []string{"-c", "echo bye; exit 3"},
			Log: filepath.Join(t.TempDir(), "child.log"), Unexpected: func(err error) { got <- err }})
		if err != nil {
			t.Fatal(err)
		}
		if err := <-got; !strings.Contains(err.Error(), "quitter") || !strings.Contains(err.Error(), "exit status 3") {
			t.Errorf("Unexpected got %v, want quitter's exit status 3", err)
		}
		if _, err := p.Stop(time.Minute); err != nil {
			t.Errorf("Stop after a reported exit = %v, want nil", err)
		}
		if tail := p.Tail(1); tail != "bye" {
			t.Errorf("Tail(1) = %q, want bye", tail)
		}
	})
	t.Run("Without Unexpected, Stop answers an earlier exit's error", func(t *testing.T) {
		p, err := Exec(Spec{Name: "quitter", Path: "/bin/sh", Args: []string{"-c", "exit 4"}})
		if err != nil {
			t.Fatal(err)
		}
		<-p.Exited()
		if _, err := p.Stop(time.Minute); err == nil || !strings.Contains(err.Error(), "exit status 4") {
			t.Errorf("Stop = %v, want exit status 4", err)
		}
	})
	t.Run("WaitLine answers the output's end, and a failed wait goes to Fail", func(t *testing.T) {
		failed := make(chan string, 1)
		p, err := Exec(Spec{Name: "short", Path: "/bin/sh", Args: []string{"-c", "echo one"},
			Fail: func(msg string) { failed <- msg; panic(msg) }})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.WaitLine(context.Background(), 0, []string{"two"}); !errors.Is(err, ErrOutputEnded) {
			t.Errorf("WaitLine = %v, want ErrOutputEnded", err)
		}
		func() {
			defer func() { _ = recover() }()
			p.WaitFor("two")
		}()
		select {
		case msg := <-failed:
			if !strings.Contains(msg, `"two"`) {
				t.Errorf("Fail got %q, want it to name the line", msg)
			}
		default:
			t.Error("a failed WaitFor did not call Fail")
		}
	})
}

func TestLogLinesKeepsTheLastLinesWithTheirIndex(t *testing.T) {
	l := newLogLines(3)
	for i := range 10 {
		l.add(string(rune('a' + i)))
	}
	lines, base, _, _ := l.snapshot()
	if base+len(lines) != 10 || len(lines) < 3 || lines[len(lines)-1] != "j" || lines[0] != string(rune('a'+base)) {
		t.Errorf("snapshot = %q from %d, want the last lines of 10 with their index", lines, base)
	}
}

func TestOptionsStartKillsAtTheEndOfTheTest(t *testing.T) {
	var p *Proc
	t.Run("inner", func(t *testing.T) {
		p = Options{Timeout: time.Minute, Tail: 5}.Start(t, "sleeper", "/bin/sh", "-c", "echo LEASEHOLD_LOG_FORMAT=$LEASEHOLD_LOG_FORMAT; exec sleep 60")
		p.WaitFor("LEASEHOLD_LOG_FORMAT=text")
	})
	if !p.HasExited() {
		t.Error("the process runs after its test ended")
	}
}

func TestProgramRunsLikeATest(t *testing.T) {
	prog := NewProgram(t.Context(), t.TempDir(), io.Discard)
	var after, cleaned bool
	err := prog.Run(func() {
		prog.Cleanup(func() { cleaned = true })
		prog.Fatalf("stopped at %d", 1)
		after = true
	})
	if err == nil || err.Error() != "stopped at 1" || after || !prog.Failed() {
		t.Errorf("Run = %v, code after Fatalf ran %v, Failed %v; want the Fatalf message and the goroutine ended", err, after, prog.Failed())
	}
	if err := prog.Run(func() {}); err != nil {
		t.Errorf("a later Run = %v, want nil", err)
	}
	if cleaned {
		t.Error("a cleanup ran before Close")
	}
	prog.Close()
	if !cleaned {
		t.Error("Close did not run the cleanup")
	}
}

func TestOptionsStartReportsToAProgram(t *testing.T) {
	prog := NewProgram(t.Context(), t.TempDir(), io.Discard)
	var p *Proc
	err := prog.Run(func() {
		p = Options{Timeout: time.Minute, Tail: 5}.Start(prog, "short", "/bin/sh", "-c", "echo one")
		p.WaitFor("two")
	})
	if err == nil || !strings.Contains(err.Error(), `"two"`) {
		t.Errorf("Run = %v, want the failed wait", err)
	}
	prog.Close()
	if !p.HasExited() {
		t.Error("the process runs after Close")
	}
}
