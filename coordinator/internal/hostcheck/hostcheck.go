package hostcheck

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// loopbackNames are the names of this machine every guard answers to,
// with its listener's port.
var loopbackNames = []string{"localhost", "127.0.0.1", "::1"}

// hostName is a name a guard answers to: a host, and the port it must come
// with, or "" for the listener's port or none.
type hostName struct {
	host, port string
}

// Guard checks the Host of requests. It is safe for concurrent use.
type Guard struct {
	hosts []hostName
	log   *slog.Logger
	// what names the server in the log and the refusal ("console", ...).
	what string
}

// New returns a guard that answers to names besides the loopback names
// and the address a request came in on (see the package documentation),
// logging refusals on log as refusals of what. It fails when a name is
// neither a host name nor an IP address, with or without a port.
func New(names []string, what string, log *slog.Logger) (*Guard, error) {
	hosts, err := parseHosts(names)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Guard{hosts: hosts, log: log, what: what}, nil
}

// CheckHosts reports what is wrong with names as a guard's names, if
// anything: each must be a host name or IP address, with or without a
// port.
func CheckHosts(names []string) error {
	_, err := parseHosts(names)
	return err
}

// parseHosts checks a guard's names: each a host name or IP address, with
// or without a port.
func parseHosts(names []string) ([]hostName, error) {
	var out []hostName
	for _, n := range names {
		n = strings.TrimSpace(n)
		h := hostName{host: n}
		if host, port, err := net.SplitHostPort(n); err == nil {
			if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
				return nil, fmt.Errorf("host %q: the port must be a number from 1 to 65535", n)
			}
			h = hostName{host: host, port: port}
		}
		h.host = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(h.host, "["), "]"))
		if h.host == "" || (strings.ContainsAny(h.host, "/@?#:% ") && net.ParseIP(h.host) == nil) {
			return nil, fmt.Errorf("host %q is not a host name or an IP address", n)
		}
		out = append(out, h)
	}
	return out, nil
}

// errMisdirected refuses a request whose Host the guard does not answer
// to.
var errMisdirected = errors.New("misdirected request")

// check accepts r only when its Host names this server (see the package
// documentation). A Host without a port stands for the scheme's default
// port.
func (g *Guard) check(r *http.Request) error {
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	host, port, hadPort := splitHost(r.Host)
	if !hadPort {
		port = "80"
		if r.TLS != nil {
			port = "443"
		}
	}
	for _, h := range g.hosts {
		if h.host == host && (h.port == port || h.port == "" && (!hadPort || port == Port(local))) {
			return nil
		}
	}
	if local == nil || port != Port(local) {
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

// Port returns the port of a listener's address, or "".
func Port(a net.Addr) string {
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

// Handler wraps h with the check: a request for another host is answered
// 421 Misdirected Request, with no page, no cookie and no redirect.
func (g *Guard) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := g.check(r); err != nil {
			g.log.Info(g.what+": refused a request for another host", "host", r.Host, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusMisdirectedRequest)
			fmt.Fprintln(w, "This address does not answer to that host name. Open it by the address it listens on, "+
				"or by localhost with its port, or name the host with the coordinator's --console-host.")
			return
		}
		h.ServeHTTP(w, r)
	})
}
