package testbin

import (
	"net"
	"path/filepath"
	"slices"
	"strconv"
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

func TestChild(t *testing.T) {
	t.Run("Stop ends a running child with SIGTERM and reports how it exited", func(t *testing.T) {
		log := filepath.Join(t.TempDir(), "child.log")
		c, err := StartChild("sleeper", "/bin/sh", []string{"-c", "echo up; exec sleep 60"}, []string{"MARK=1"}, log, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.Exited() {
			t.Fatal("the child exited at once")
		}
		_, err = c.Stop(time.Minute)
		if err == nil || !strings.Contains(err.Error(), "terminated") {
			t.Errorf("Stop = %v, want the SIGTERM exit", err)
		}
		if !c.Exited() {
			t.Error("Exited is false after Stop")
		}
		if text := c.LogText(); !strings.HasPrefix(text, "# MARK=1 /bin/sh -c") {
			t.Errorf("log = %q, want the command line first", text)
		}
	})
	t.Run("An exit before Stop is reported to unexpected, and Stop then answers nil", func(t *testing.T) {
		got := make(chan error, 1)
		c, err := StartChild("quitter", "/bin/sh", []string{"-c", "echo bye; exit 3"}, nil,
			filepath.Join(t.TempDir(), "child.log"), func(err error) { got <- err })
		if err != nil {
			t.Fatal(err)
		}
		if err := <-got; !strings.Contains(err.Error(), "quitter") || !strings.Contains(err.Error(), "exit status 3") {
			t.Errorf("unexpected got %v, want quitter's exit status 3", err)
		}
		if _, err := c.Stop(time.Minute); err != nil {
			t.Errorf("Stop after a reported exit = %v, want nil", err)
		}
		if tail := c.Tail(1); tail != "bye" {
			t.Errorf("Tail(1) = %q, want bye", tail)
		}
	})
	t.Run("Without unexpected, Stop answers an earlier exit's error", func(t *testing.T) {
		c, err := StartChild("quitter", "/bin/sh", []string{"-c", "exit 4"}, nil, filepath.Join(t.TempDir(), "child.log"), nil)
		if err != nil {
			t.Fatal(err)
		}
		<-c.Done()
		if _, err := c.Stop(time.Minute); err == nil || !strings.Contains(err.Error(), "exit status 4") {
			t.Errorf("Stop = %v, want exit status 4", err)
		}
	})
}

func TestFreeAddrAvoidsEphemeralPorts(t *testing.T) {
	low := ephemeralLow()
	seen := make(map[string]bool)
	for range 20 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Errorf("FreeAddr returned %s twice", addr)
		}
		seen[addr] = true
		_, port, _ := net.SplitHostPort(addr)
		if p, _ := strconv.Atoi(port); low > 10100 && p >= low {
			t.Errorf("FreeAddr = %s, in the ephemeral range from %d", addr, low)
		}
	}
}
