package chaos

import (
	"errors"
	"time"
)

// config is a crash run's settings, from the test's flags.
type config struct {
	cycles         int
	seed           uint64
	minUptime      time.Duration
	maxUptime      time.Duration
	failpointEvery int
	fireTimeout    time.Duration
	drainTimeout   time.Duration
	renderers      int
	leaseTTL       time.Duration
	tmp            string
	keep           bool
	// raft runs the coordinator as a cluster of one voter.
	raft bool
}

// validate checks the values a run cannot start with.
func (c config) validate() error {
	switch {
	case c.cycles < 1:
		return errors.New("-cycles must be at least 1")
	case c.minUptime <= 0 || c.maxUptime < c.minUptime:
		return errors.New("-min-uptime must be positive and at most -max-uptime")
	case c.renderers < 1:
		return errors.New("-renderers must be at least 1")
	case c.failpointEvery < 0:
		return errors.New("-failpoint-every must not be negative")
	case c.fireTimeout <= 0 || c.drainTimeout <= 0 || c.leaseTTL <= 0:
		return errors.New("-fire-timeout, -drain-timeout and -lease-ttl must be above zero")
	}
	return nil
}
