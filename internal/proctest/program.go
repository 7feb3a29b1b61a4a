package proctest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"testing"
)

// TB is what Options.Start and the packages built on it report to:
// the methods of testing.TB they use. A *testing.T is one; a Program is
// one for a program outside go test.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
	Failed() bool
	Cleanup(func())
	TempDir() string
	Context() context.Context
}

var _ TB = testing.TB(nil)

// Program is a TB for a program (a campaign, a benchmark): Run calls a
// function on a goroutine of its own, as go test calls a test, and a
// Fatal or Fatalf there ends that goroutine and is Run's error. Cleanups
// registered meanwhile run at Close, the last first. Runs are one at a
// time.
type Program struct {
	ctx context.Context
	dir string
	log io.Writer

	mu       sync.Mutex
	cleanups []func()
	errs     []error
}

// NewProgram returns a Program whose Context is ctx, whose TempDir makes
// directories under dir, and whose Logf writes a line to log.
func NewProgram(ctx context.Context, dir string, log io.Writer) *Program {
	return &Program{ctx: ctx, dir: dir, log: log}
}

// Run calls f on a new goroutine and returns the errors Fatal, Fatalf and
// Errorf reported while it ran, joined.
func (p *Program) Run(f func()) error {
	p.mu.Lock()
	from := len(p.errs)
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
	p.mu.Lock()
	defer p.mu.Unlock()
	return errors.Join(p.errs[from:]...)
}

// Close runs the cleanups, the last registered first.
func (p *Program) Close() {
	for {
		p.mu.Lock()
		if len(p.cleanups) == 0 {
			p.mu.Unlock()
			return
		}
		f := p.cleanups[len(p.cleanups)-1]
		p.cleanups = p.cleanups[:len(p.cleanups)-1]
		p.mu.Unlock()
		f()
	}
}

// Helper does nothing: a program's messages name no lines.
func (p *Program) Helper() {}

// Fatal records its arguments as an error and ends the goroutine.
func (p *Program) Fatal(args ...any) {
	p.record(errors.New(fmt.Sprint(args...)))
	runtime.Goexit()
}

// Fatalf records the message as an error and ends the goroutine.
func (p *Program) Fatalf(format string, args ...any) {
	p.record(fmt.Errorf(format, args...))
	runtime.Goexit()
}

// Errorf records the message as an error.
func (p *Program) Errorf(format string, args ...any) { p.record(fmt.Errorf(format, args...)) }

func (p *Program) record(err error) {
	p.mu.Lock()
	p.errs = append(p.errs, err)
	p.mu.Unlock()
}

// Logf writes the message to the log as a line.
func (p *Program) Logf(format string, args ...any) { fmt.Fprintf(p.log, format+"\n", args...) }

// Failed reports whether an error was recorded.
func (p *Program) Failed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.errs) > 0
}

// Cleanup registers f for Close.
func (p *Program) Cleanup(f func()) {
	p.mu.Lock()
	p.cleanups = append(p.cleanups, f)
	p.mu.Unlock()
}

// TempDir makes a new directory under the Program's directory; it is
// not removed (the program keeps or removes its directory as a whole).
func (p *Program) TempDir() string {
	dir, err := os.MkdirTemp(p.dir, "tmp-")
	if err != nil {
		p.Fatalf("TempDir: %v", err)
	}
	return dir
}

// Context is the Program's context.
func (p *Program) Context() context.Context { return p.ctx }
