package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the times in /proc/<pid>/stat: the kernel reports
// them in USER_HZ ticks, which is 100 on every Linux architecture Go
// supports, whatever the kernel's internal HZ.
const userHZ = 100

// cpuTime reads the user plus system CPU time that process pid (all its
// threads) has used, from /proc/<pid>/stat; pid 0 means this process
// (/proc/self). The resolution is one tick, 10 ms.
func cpuTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(procPath(pid, "stat"))
	if err != nil {
		return 0, err
	}
	return parseStat(data)
}

// parseStat returns utime + stime from the contents of /proc/<pid>/stat. The
// second field, the command name in parentheses, may itself hold spaces and
// parentheses, so the fields are counted after its last ')': utime and
// stime are the 14th and 15th fields of the line.
func parseStat(data []byte) (time.Duration, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, fmt.Errorf("parsing /proc stat %q: no command name", truncate(data))
	}
	fields := strings.Fields(string(data[end+1:]))
	// fields[0] is the 3rd field (state), so the 14th is fields[11].
	const utime, stime = 14 - 3, 15 - 3
	if len(fields) <= stime {
		return 0, fmt.Errorf("parsing /proc stat %q: %d fields after the command name, want at least %d", truncate(data), len(fields), stime+1)
	}
	var ticks uint64
	for _, i := range []int{utime, stime} {
		n, err := strconv.ParseUint(fields[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing /proc stat field %d: %w", i+3, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// memory is a process's resident set size, now and at its peak.
type memory struct {
	// RSS is VmRSS, the resident set size now, in bytes.
	RSS int64 `json:"rss_bytes"`
	// HWM is VmHWM, the peak resident set size, in bytes.
	HWM int64 `json:"hwm_bytes"`
	// Anon and File split RSS now: anonymous memory (the Go heap and
	// stacks) and file-backed pages (for the coordinator mostly bbolt's
	// memory map of its file, which the kernel may drop at will).
	Anon int64 `json:"rss_anon_bytes,omitempty"`
	File int64 `json:"rss_file_bytes,omitempty"`
}

// readMemory reads process pid's VmRSS and VmHWM from /proc/<pid>/status.
func readMemory(pid int) (memory, error) {
	data, err := os.ReadFile(procPath(pid, "status"))
	if err != nil {
		return memory{}, err
	}
	return parseStatus(data)
}

// parseStatus extracts VmRSS and VmHWM, and RssAnon and RssFile where the
// kernel gives them, from the contents of /proc/<pid>/status, where they
// read "VmRSS:	   12345 kB".
func parseStatus(data []byte) (memory, error) {
	var m memory
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch key {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.HWM
		case "RssAnon":
			dst = &m.Anon
			found--
		case "RssFile":
			dst = &m.File
			found--
		default:
			continue
		}
		f := strings.Fields(value)
		if len(f) != 2 || f[1] != "kB" {
			return memory{}, fmt.Errorf("parsing /proc status: %s is %q, want \"<n> kB\"", key, strings.TrimSpace(value))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("parsing /proc status %s: %w", key, err)
		}
		*dst = kb << 10
		found++
	}
	if err := sc.Err(); err != nil {
		return memory{}, err
	}
	if found != 2 {
		return memory{}, fmt.Errorf("parsing /proc status: VmRSS or VmHWM missing (a kernel thread or an exited process?)")
	}
	return m, nil
}

// procPath is /proc/<pid>/name, or /proc/self/name for pid 0.
func procPath(pid int, name string) string {
	if pid == 0 {
		return "/proc/self/" + name
	}
	return "/proc/" + strconv.Itoa(pid) + "/" + name
}

// truncate shortens data for an error message.
func truncate(data []byte) string {
	const most = 80
	if len(data) > most {
		return string(data[:most]) + "..."
	}
	return string(data)
}

// loadAverage reads the one-minute load average from /proc/loadavg.
func loadAverage() (float64, error) {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	return parseLoadavg(data)
}

// parseLoadavg returns the first field of /proc/loadavg, the one-minute
// load average.
func parseLoadavg(data []byte) (float64, error) {
	f := strings.Fields(string(data))
	if len(f) < 1 {
		return 0, fmt.Errorf("parsing /proc/loadavg %q: empty", truncate(data))
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("parsing /proc/loadavg: %w", err)
	}
	return v, nil
}

// writeBytes reads how many bytes process pid (all its threads) has caused
// to be written to storage, from write_bytes in /proc/<pid>/io: pages sent
// to the block layer, so fsynced bbolt pages count and writes to a pipe or
// socket do not. pid 0 means this process.
func writeBytes(pid int) (int64, error) {
	data, err := os.ReadFile(procPath(pid, "io"))
	if err != nil {
		return 0, err
	}
	return parseIO(data)
}

// parseIO returns write_bytes from the contents of /proc/<pid>/io.
func parseIO(data []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || key != "write_bytes" {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing /proc io write_bytes: %w", err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("parsing /proc io %q: no write_bytes", truncate(data))
}
