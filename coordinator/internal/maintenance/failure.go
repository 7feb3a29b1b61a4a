package maintenance

// FailureWatcher calls onFail once failed is closed (the writer
// fail-stopped), unless it is stopped first.
type FailureWatcher struct {
	service
	failed <-chan struct{}
	onFail func()
}

// NewFailureWatcher returns a watcher of failed.
func NewFailureWatcher(failed <-chan struct{}, onFail func()) *FailureWatcher {
	return &FailureWatcher{service: newService(), failed: failed, onFail: onFail}
}

// Start starts watching; calling it again does nothing.
func (w *FailureWatcher) Start() {
	w.start(func(stopC <-chan struct{}) {
		select {
		case <-w.failed:
			w.onFail()
		case <-stopC:
		}
	})
}

// Stop stops watching and waits.
func (w *FailureWatcher) Stop() { w.stop() }
