//go:build linux

package deploy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
)

// podNetworkCommand returns the command that runs this test binary in a
// network and a mount namespace of its own: as root directly, otherwise
// inside a user namespace that maps the caller to root, where the kernel
// allows one. Go's unshare in the child makes every mount private first,
// so nothing mounted inside reaches the host.
func podNetworkCommand(args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS}
	if uid, gid := os.Getuid(), os.Getgid(); uid != 0 {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}}
	}
	return cmd, nil
}

// namespacesUnavailable reports whether err says that this machine or
// this user may not make the namespaces (or configure them), rather than
// that something went wrong in them.
func namespacesUnavailable(err error) bool {
	for _, errno := range []syscall.Errno{syscall.EPERM, syscall.EACCES, syscall.EINVAL, syscall.ENOSYS, syscall.EOPNOTSUPP, syscall.ENOSPC, syscall.EUSERS} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// setUpPodNetwork runs inside the namespaces: it brings the loopback
// device up with addrs on it besides 127.0.0.1, and bind-mounts the file
// hosts over /etc/hosts, where Go's resolver and the C library's look
// first.
func setUpPodNetwork(hosts string, addrs ...netip.Addr) error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return err
	}
	if err := netlink(syscall.RTM_NEWLINK, 0, syscall.IfInfomsg{
		Family: syscall.AF_UNSPEC, Index: int32(lo.Index), Flags: syscall.IFF_UP, Change: syscall.IFF_UP,
	}); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	for _, a := range addrs {
		if !a.Is4() {
			return fmt.Errorf("%s: only IPv4 addresses are set up", a)
		}
		ip := a.As4()
		if err := netlink(syscall.RTM_NEWADDR, syscall.NLM_F_CREATE|syscall.NLM_F_EXCL,
			syscall.IfAddrmsg{Family: syscall.AF_INET, Prefixlen: 32, Index: uint32(lo.Index)},
			rtAttr{syscall.RtAttr{Len: syscall.SizeofRtAttr + 4, Type: syscall.IFA_LOCAL}, ip},
			rtAttr{syscall.RtAttr{Len: syscall.SizeofRtAttr + 4, Type: syscall.IFA_ADDRESS}, ip},
		); err != nil {
			return fmt.Errorf("adding %s to lo: %w", a, err)
		}
	}
	if err := syscall.Mount(hosts, "/etc/hosts", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s over /etc/hosts: %w", hosts, err)
	}
	return nil
}

// rtAttr is a route attribute carrying an IPv4 address.
type rtAttr struct {
	syscall.RtAttr
	IP [4]byte
}

// netlink sends one rtnetlink request made of parts (fixed-size structs,
// written in the machine's byte order) and waits for its acknowledgement.
func netlink(msgType, flags uint16, parts ...any) error {
	var body bytes.Buffer
	for _, p := range parts {
		if err := binary.Write(&body, binary.NativeEndian, p); err != nil {
			return err
		}
	}
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer syscall.Close(fd)
	kernel := &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink bind: %w", err)
	}
	var msg bytes.Buffer
	hdr := syscall.NlMsghdr{
		Len:   uint32(syscall.SizeofNlMsghdr + body.Len()),
		Type:  msgType,
		Flags: syscall.NLM_F_REQUEST | syscall.NLM_F_ACK | flags,
		Seq:   1,
	}
	if err := binary.Write(&msg, binary.NativeEndian, hdr); err != nil {
		return err
	}
	msg.Write(body.Bytes())
	if err := syscall.Sendto(fd, msg.Bytes(), 0, kernel); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 1<<16)
	for {
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		replies, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("netlink reply: %w", err)
		}
		for _, r := range replies {
			if r.Header.Seq != hdr.Seq || r.Header.Type != syscall.NLMSG_ERROR {
				continue
			}
			if len(r.Data) < 4 {
				return errors.New("netlink: short acknowledgement")
			}
			if code := int32(binary.NativeEndian.Uint32(r.Data)); code != 0 {
				return syscall.Errno(-code)
			}
			return nil
		}
	}
}
