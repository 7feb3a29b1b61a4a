package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		stat    string
		want    time.Duration
		wantErr string
	}{
		{
			name: "PlainCommand",
			stat: "4242 (coordinator) S 1 4242 4242 0 -1 4194560 2410 0 0 0 1234 56 0 0 20 0 9 0 12345 1500000000 20000 18446744073709551615",
			want: (1234 + 56) * 10 * time.Millisecond,
		},
		{
			name: "CommandWithSpacesAndParentheses",
			stat: "77 (a b) (c)) R 1 77 77 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1",
			want: 70 * time.Millisecond,
		},
		{
			name:    "TooFewFields",
			stat:    "1 (x) S 1 2 3",
			wantErr: "fields after the command name",
		},
		{
			name:    "NoCommand",
			stat:    "garbage",
			wantErr: "no command name",
		},
		{
			name:    "NotANumber",
			stat:    "1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 4 0 0",
			wantErr: "field 14",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseStat([]byte(tt.stat))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseStat error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseStat: %v", err)
			}
			if got != tt.want {
				t.Errorf("parseStat = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestParseStatus(t *testing.T) {
	t.Parallel()
	t.Run("ReadsRSSAndHWM", func(t *testing.T) {
		t.Parallel()
		status := "Name:\tcoordinator\nVmPeak:\t 2000000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\nThreads:\t9\n"
		got, err := parseStatus([]byte(status))
		if err != nil {
			t.Fatal(err)
		}
		if want := (memory{RSS: 40 << 20, HWM: 50 << 20}); got != want {
			t.Errorf("parseStatus = %+v, want %+v", got, want)
		}
	})
	t.Run("SplitsRSSWhereTheKernelDoes", func(t *testing.T) {
		t.Parallel()
		status := "VmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\nRssAnon:\t   10240 kB\nRssFile:\t   30720 kB\n"
		got, err := parseStatus([]byte(status))
		if err != nil {
			t.Fatal(err)
		}
		if want := (memory{RSS: 40 << 20, HWM: 50 << 20, Anon: 10 << 20, File: 30 << 20}); got != want {
			t.Errorf("parseStatus = %+v, want %+v", got, want)
		}
	})
	t.Run("MissingFieldsAreAnError", func(t *testing.T) {
		t.Parallel()
		if _, err := parseStatus([]byte("Name:\tkthreadd\nThreads:\t1\n")); err == nil {
			t.Error("parseStatus without VmRSS: no error")
		}
	})
	t.Run("AnotherUnitIsAnError", func(t *testing.T) {
		t.Parallel()
		if _, err := parseStatus([]byte("VmHWM:\t1 MB\nVmRSS:\t1 kB\n")); err == nil {
			t.Error("parseStatus with MB: no error")
		}
	})
}

func TestProcSelf(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc:", err)
	}
	if _, err := cpuTime(0); err != nil {
		t.Errorf("cpuTime(self): %v", err)
	}
	m, err := readMemory(os.Getpid())
	if err != nil {
		t.Fatalf("readMemory(self): %v", err)
	}
	if m.RSS <= 0 || m.HWM < m.RSS {
		t.Errorf("readMemory(self) = %+v, want 0 < RSS <= HWM", m)
	}
}

func TestParseLoadavg(t *testing.T) {
	t.Parallel()
	got, err := parseLoadavg([]byte("24.63 17.05 9.08 3/512 16065\n"))
	if err != nil || got != 24.63 {
		t.Errorf("parseLoadavg = %v, %v; want 24.63", got, err)
	}
	for _, bad := range []string{"", "x 1 2"} {
		if _, err := parseLoadavg([]byte(bad)); err == nil {
			t.Errorf("parseLoadavg(%q): no error", bad)
		}
	}
}

func TestParseIO(t *testing.T) {
	t.Parallel()
	const sample = "rchar: 1948\nwchar: 306\nsyscr: 7\nsyscw: 3\nread_bytes: 4096\nwrite_bytes: 1269760\ncancelled_write_bytes: 0\n"
	got, err := parseIO([]byte(sample))
	if err != nil || got != 1269760 {
		t.Fatalf("parseIO = %d, %v; want 1269760", got, err)
	}
	if _, err := parseIO([]byte("rchar: 1\n")); err == nil {
		t.Fatal("parseIO without write_bytes: no error")
	}
	if _, err := parseIO([]byte("write_bytes: lots\n")); err == nil {
		t.Fatal("parseIO with a bad number: no error")
	}
}
