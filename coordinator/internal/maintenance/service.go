package maintenance

import "sync"

// service is the start and stop of one goroutine.
type service struct {
	startOnce, stopOnce sync.Once
	stopC, doneC        chan struct{}
	started             bool
}

func newService() service { return service{stopC: make(chan struct{}), doneC: make(chan struct{})} }

// start runs loop on its own goroutine, once; loop returns when stopC is
// closed.
func (s *service) start(loop func(stopC <-chan struct{})) {
	s.startOnce.Do(func() {
		s.started = true
		go func() {
			defer close(s.doneC)
			loop(s.stopC)
		}()
	})
}

// stop ends the loop and waits for it; safe twice or without start.
func (s *service) stop() {
	s.startOnce.Do(func() {}) // a service stopped first never starts
	s.stopOnce.Do(func() { close(s.stopC) })
	if s.started {
		<-s.doneC
	}
}
