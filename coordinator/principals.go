package coordinator

import (
	"errors"
	"fmt"
	"net"

	"github.com/leasehold/leasehold/coordinator/internal/auth"
)

// principals loads the principals file, or falls back to the development
// tokens on a loopback address.
func (c *Coordinator) principals() (*auth.Set, error) {
	if c.cfg.TokensFile != "" {
		f, err := auth.OpenFile(c.cfg.TokensFile, c.log)
		if err != nil {
			return nil, err
		}
		c.principalsFile = f
		return f.Set(), nil
	}
	if c.cfg.Listen != "" && !loopbackHost(c.cfg.Listen) {
		return nil, fmt.Errorf("no principals file (--tokens) and listen address %s is not loopback: "+
			"refusing to serve the public development tokens on a network address", c.cfg.Listen)
	}
	c.devTokens = true
	c.log.Warn("no principals file: using the public development tokens (dev-alpha, dev-beta, dev-renderer, dev-operator, dev-operator-alpha); " +
		"loopback listeners only, and only from this machine")
	return auth.DevPrincipals(), nil
}

// ReloadPrincipals reads the principals file again (the command calls it
// on SIGHUP): a valid file replaces the principals at once, for gRPC calls
// and console sign-ins alike, so a token removed from it is refused from
// its next call, and the streams in progress that the new principals no
// longer allow end (see auth.Set.Replace); an invalid one leaves the
// principals as they were. Either
// way the log says what happened, and the error says why a reload failed.
func (c *Coordinator) ReloadPrincipals() error {
	if c.principalsFile == nil {
		err := errors.New("no principals file to reload: the coordinator runs on the development tokens")
		c.log.Warn("reloading the principals", "err", err)
		return err
	}
	return c.principalsFile.Reload()
}

// loopbackHost reports whether a host:port address names a loopback host.
func loopbackHost(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// localAddr reports whether a listener address is reachable only from this
// machine: a loopback TCP address, or a non-network listener (a Unix
// socket, an in-process buffer).
func localAddr(a net.Addr) bool {
	switch a.Network() {
	case "tcp", "tcp4", "tcp6", "udp", "udp4", "udp6":
		if ta, ok := a.(*net.TCPAddr); ok {
			return ta.IP.IsLoopback()
		}
		return loopbackHost(a.String())
	}
	return true
}
