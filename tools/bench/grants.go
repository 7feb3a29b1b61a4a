package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// grantLog follows the renderers' --record files, where each renderer
// appends "job_id token" for every grant it receives, and tells when a
// job's grant arrived. It is woken by inotify as soon as a renderer writes,
// so the arrival time it records is the write's, give or take the
// harness's own scheduling (microseconds on an idle machine).
type grantLog struct {
	inotify *os.File
	files   []*recordFile

	mu      sync.Mutex
	arrived map[string]time.Time
	waiters map[string]chan time.Time

	done chan struct{}
}

// recordFile is one record file and the part of it not yet read.
type recordFile struct {
	f       *os.File
	partial []byte
}

// newGrantLog creates (empty) and follows the record files at paths. Start
// the renderers after it, so that no grant is written before it watches.
func newGrantLog(paths []string) (*grantLog, error) {
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	// A non-blocking descriptor is served by the runtime's poller, so Close
	// wakes the reading goroutine.
	g := &grantLog{
		inotify: os.NewFile(uintptr(fd), "inotify"),
		arrived: make(map[string]time.Time),
		waiters: make(map[string]chan time.Time),
		done:    make(chan struct{}),
	}
	for _, p := range paths {
		f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE, 0o644)
		if err != nil {
			g.closeFiles()
			return nil, err
		}
		g.files = append(g.files, &recordFile{f: f})
		if _, err := syscall.InotifyAddWatch(fd, p, syscall.IN_MODIFY); err != nil {
			g.closeFiles()
			return nil, fmt.Errorf("inotify watch of %s: %w", p, err)
		}
	}
	go g.loop()
	return g, nil
}

// loop reads the record files whenever inotify says one changed.
func (g *grantLog) loop() {
	defer close(g.done)
	buf := make([]byte, 4096)
	for {
		if _, err := g.inotify.Read(buf); err != nil {
			return
		}
		at := time.Now()
		for _, rf := range g.files {
			g.readNew(rf, at)
		}
	}
}

// readNew reads what rf gained since the last read and records the grants
// of its complete lines as arrived at at.
func (g *grantLog) readNew(rf *recordFile, at time.Time) {
	buf := make([]byte, 4096)
	for {
		n, err := rf.f.Read(buf)
		rf.partial = append(rf.partial, buf[:n]...)
		if n == 0 || err != nil {
			break
		}
	}
	lines, rest := splitLines(rf.partial)
	rf.partial = append(rf.partial[:0], rest...)
	for _, l := range lines {
		jobID, _, err := parseGrantLine(l)
		if err != nil {
			continue
		}
		g.record(jobID, at)
	}
}

// record notes a grant's arrival and wakes its waiter.
func (g *grantLog) record(jobID string, at time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, dup := g.arrived[jobID]; dup {
		return // a second grant of the job (a retry): the first one counts
	}
	g.arrived[jobID] = at
	if w, ok := g.waiters[jobID]; ok {
		w <- at
		delete(g.waiters, jobID)
	}
}

// wait returns when jobID's first grant arrived at a renderer, waiting for
// it if need be.
func (g *grantLog) wait(ctx context.Context, jobID string) (time.Time, error) {
	g.mu.Lock()
	if at, ok := g.arrived[jobID]; ok {
		g.mu.Unlock()
		return at, nil
	}
	w := make(chan time.Time, 1)
	g.waiters[jobID] = w
	g.mu.Unlock()
	select {
	case at := <-w:
		return at, nil
	case <-ctx.Done():
		g.mu.Lock()
		delete(g.waiters, jobID)
		g.mu.Unlock()
		return time.Time{}, context.Cause(ctx)
	}
}

// close stops following and closes the files.
func (g *grantLog) close() {
	g.inotify.Close()
	<-g.done
	g.closeFiles()
}

func (g *grantLog) closeFiles() {
	for _, rf := range g.files {
		rf.f.Close()
	}
}

// splitLines returns the complete lines of data (without their newlines)
// and what follows the last newline.
func splitLines(data []byte) (lines [][]byte, rest []byte) {
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return lines, data
		}
		lines = append(lines, data[:i])
		data = data[i+1:]
	}
}

// parseGrantLine parses a record line, "job_id token".
func parseGrantLine(line []byte) (jobID string, token uint64, err error) {
	f := bytes.Fields(line)
	if len(f) != 2 {
		return "", 0, fmt.Errorf("record line %q: want \"job_id token\"", line)
	}
	token, err = strconv.ParseUint(string(f[1]), 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("record line %q: %w", line, err)
	}
	return string(f[0]), token, nil
}
