package jobs

// Counts is a number of jobs per phase, indexed by Phase.
type Counts [PhaseCancelled + 1]int64

// Add adds d to c.
func (c *Counts) Add(d Counts) {
	for i := range c {
		c[i] += d[i]
	}
}

// Total returns the number of jobs counted.
func (c Counts) Total() int64 {
	var n int64
	for _, v := range c {
		n += v
	}
	return n
}

// Unfinished returns the number of jobs not in a terminal phase.
func (c Counts) Unfinished() int64 {
	return c[PhaseQueued] + c[PhaseLeased] + c[PhaseRetryWait]
}

// State is what a watch needs of a job: its phase and its last event.
type State struct {
	ID       uint64
	Phase    Phase
	EventSeq uint32
}

// Preview is a completion's preview carried inline: the bytes with their
// digest and media type, computed by the caller off the writer goroutine.
type Preview struct {
	Digest      string
	ContentType string
	Content     []byte
}
