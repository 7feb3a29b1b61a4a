package maintenance

import (
	"cmp"
	"time"
)

// SummarizerIntervalDefault is how often a Summarizer summarizes.
const SummarizerIntervalDefault = time.Second

// Summarizer calls summarize every interval, and once more when it stops:
// it writes the summaries of refusal logs that were rate-limited.
type Summarizer struct {
	service
	summarize func()
	interval  time.Duration
}

// NewSummarizer returns a Summarizer of summarize every interval (0: the
// default).
func NewSummarizer(summarize func(), interval time.Duration) *Summarizer {
	return &Summarizer{service: newService(), summarize: summarize, interval: cmp.Or(interval, SummarizerIntervalDefault)}
}

// Start starts the loop; calling it again does nothing.
func (f *Summarizer) Start() {
	f.start(func(stopC <-chan struct{}) {
		t := time.NewTicker(f.interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				f.summarize()
			case <-stopC:
				f.summarize()
				return
			}
		}
	})
}

// Stop stops the loop, after a last summary, and waits for it.
func (f *Summarizer) Stop() { f.stop() }
