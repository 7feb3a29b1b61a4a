//go:build !linux

package deploy

import (
	"errors"
	"net/netip"
	"os/exec"
)

var errNoNamespaces = errors.New("network and mount namespaces are Linux's")

func podNetworkCommand(...string) (*exec.Cmd, error) { return nil, errNoNamespaces }

func namespacesUnavailable(err error) bool { return errors.Is(err, errNoNamespaces) }

func setUpPodNetwork(string, ...netip.Addr) error { return errNoNamespaces }
