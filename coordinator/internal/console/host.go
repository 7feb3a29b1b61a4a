package console

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// loopbackNames are the names of this machine every console answers to,
// with its listener's port.
var loopbackNames = []string{"localhost", "127.0.0.1", "::1"}

// hostName is a name the console answers to: a host, and the port it must
// come with, or "" for the listener's port or none.
type hostName struct {
	host, port string
}

// CheckHosts reports what is wrong with names as Config.Hosts, if
// anything: each must be a host name or IP address, with or without a
// port.
func CheckHosts(names []string) error {
	_, err := parseHosts(names)
	return err
}

// parseHosts checks the names of Config.Hosts: each a host name or IP
// address, with or without a port.
func parseHosts(names []string) ([]hostName, error) {
	var out []hostName
	for _, n := range names {
		n = strings.TrimSpace(n)
		h := hostName{host: n}
		if host, port, err := net.SplitHostPort(n); err == nil {
			if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
				return nil, fmt.Errorf("console host %q: the port must be a number from 1 to 65535", n)
			}
			h = hostName{host: host, port: port}
		}
		h.host = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(h.host, "["), "]"))
		if h.host == "" || (strings.ContainsAny(h.host, "/@?#:% ") && net.ParseIP(h.host) == nil) {
			return nil, fmt.Errorf("console host %q is not a host name or an IP address", n)
		}
		out = append(out, h)
	}
	return out, nil
}

// errMisdirected refuses a request whose Host the console does not answer
// to.
var errMisdirected = errors.New("misdirected request")

// checkHost accepts r only when its Host names this console, so that a
// page on another site cannot reach it by DNS rebinding (its own name
// resolved to 127.0.0.1 gives it the console's content under its own
// origin, where same-origin checks and SameSite cookies see no other
// site). The console answers to:
//
//   - localhost, 127.0.0.1 and [::1], with the port of the listener the
//     request came in on;
//   - the address the request came in on (the bound address, or the
//     interface's address under a wildcard bind): an IP address cannot be
//     rebound;
//   - the names of Config.Hosts, with the port given there, or with the
//     listener's port or none when none was given (a proxy in front of the
//     console on the scheme's default port).
//
// A Host without a port stands for the scheme's default port.
func (c *Console) checkHost(r *http.Request) error {
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	host, port, hadPort := splitHost(r.Host)
	if !hadPort {
		port = "80"
		if r.TLS != nil {
			port = "443"
		}
	}
	for _, h := range c.hosts {
		if h.host == host && (h.port == port || h.port == "" && (!hadPort || port == portOf(local))) {
			return nil
		}
	}
	if local == nil || port != portOf(local) {
		return errMisdirected
	}
	for _, n := range loopbackNames {
		if host == n {
			return nil
		}
	}
	if ip := net.ParseIP(host); ip != nil {
		if ta, ok := local.(*net.TCPAddr); ok && ta.IP.Equal(ip) {
			return nil
		}
	}
	return errMisdirected
}

// splitHost splits a Host header into a lower-case host, without the
// brackets of an IPv6 address, and its port.
func splitHost(hostport string) (host, port string, hadPort bool) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		return strings.ToLower(h), p, true
	}
	return strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]")), "", false
}

// portOf returns the port of a listener's address, or "".
func portOf(a net.Addr) string {
	if a == nil {
		return ""
	}
	if ta, ok := a.(*net.TCPAddr); ok {
		return strconv.Itoa(ta.Port)
	}
	if _, p, err := net.SplitHostPort(a.String()); err == nil {
		return p
	}
	return ""
}

// hostGuard wraps h with checkHost: a request for another host is answered
// 421 Misdirected Request, with no page, no cookie and no redirect.
func (c *Console) hostGuard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := c.checkHost(r); err != nil {
			c.log.Info("console: refused a request for another host", "host", r.Host, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusMisdirectedRequest)
			fmt.Fprintln(w, "This console does not answer to that host name. Open it by the address it listens on, "+
				"or by localhost with its port, or name the host with the coordinator's --console-host.")
			return
		}
		h.ServeHTTP(w, r)
	})
}
