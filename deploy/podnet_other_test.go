//go:build !linux

package deploy

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
)

var errNoNamespaces = errors.New("network and mount namespaces are Linux's")

func podNetworkCommand(...string) (*exec.Cmd, error) { return nil, errNoNamespaces }

func namespacesUnavailable(err error) bool { return errors.Is(err, errNoNamespaces) }

func setUpNodeNetwork(string, netip.Prefix) error { return errNoNamespaces }

func startInPod(string, []string, []string, netip.Prefix, io.Writer) (*exec.Cmd, error) {
	return nil, errNoNamespaces
}

func execInPod(string) {
	fmt.Fprintln(os.Stderr, errNoNamespaces)
	os.Exit(125)
}
