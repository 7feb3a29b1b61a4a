//go:build linux

package deploy

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"syscall"
)

// podNetworkCommand returns the command that runs this test binary in a
// network, a mount and a PID namespace of its own: as root directly,
// otherwise inside a user namespace that maps the caller to root, where
// the kernel allows one. Go's unshare in the child makes every mount
// private first, so nothing mounted inside reaches the host; the copy is
// the first process of its PID namespace, so the pods' processes end
// with it however it ends.
func podNetworkCommand(args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS, Cloneflags: syscall.CLONE_NEWPID}
	if uid, gid := os.Getuid(), os.Getgid(); uid != 0 {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}}
	}
	return cmd, nil
}

// namespacesUnavailable reports whether err says that this machine or
// this user may not make the namespaces or the links between them (or
// configure them), rather than that something went wrong in them.
func namespacesUnavailable(err error) bool {
	for _, errno := range []syscall.Errno{syscall.EPERM, syscall.EACCES, syscall.EINVAL, syscall.ENOSYS, syscall.EOPNOTSUPP, syscall.ENOSPC, syscall.EUSERS} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// bridgeName is the pod network's bridge in the node's namespace.
const bridgeName = "lh0"

// setUpNodeNetwork runs inside the node's namespaces: it brings the
// loopback device up, makes the pods' bridge with the node's address
// node on it, and bind-mounts the file hosts over /etc/hosts, where Go's
// resolver and the C library's look first. The pods' namespaces share
// this mount namespace, and so the file.
func setUpNodeNetwork(hosts string, node netip.Prefix) error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return err
	}
	if err := linkUp(lo.Index); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	// A bridge whose hardware address is not set takes the lowest of its
	// ports', and changes it when that port goes, as a stopped pod's does:
	// the pods' ARP caches would then hold a stale address for the node
	// for half a minute.
	if err := netlink(syscall.RTM_NEWLINK, syscall.NLM_F_CREATE|syscall.NLM_F_EXCL, ifInfo(0, 0, 0),
		attr(syscall.IFLA_IFNAME, cString(bridgeName)),
		attr(syscall.IFLA_ADDRESS, hardwareAddr(node.Addr())),
		attr(syscall.IFLA_LINKINFO, attr(iflaInfoKind, cString("bridge")))); err != nil {
		return fmt.Errorf("making the bridge %s: %w", bridgeName, err)
	}
	br, err := net.InterfaceByName(bridgeName)
	if err != nil {
		return err
	}
	if err := addAddr(br.Index, node); err != nil {
		return fmt.Errorf("adding %s to %s: %w", node, bridgeName, err)
	}
	if err := linkUp(br.Index); err != nil {
		return fmt.Errorf("bringing %s up: %w", bridgeName, err)
	}
	if err := syscall.Mount(hosts, "/etc/hosts", "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s over /etc/hosts: %w", hosts, err)
	}
	return nil
}

// podProgram is a pod's program and its address on the pod network.
type podProgram struct {
	Addr string   `json:"addr"`
	Path string   `json:"path"`
	Args []string `json:"args"`
	Env  []string `json:"env"`
}

// startInPod starts path with args and env as a pod's program: in a
// network namespace of its own, joined to the node's bridge by a veth
// pair whose pod end, eth0, holds addr. A copy of this binary starts in
// the new namespace, waits for its eth0, configures it and executes path
// in its place, so that the process the command holds is the program's
// and the signals sent to it are the program's. Its eth0 has a hardware
// address derived from addr, as a restarted pod keeps its address here
// and its neighbours' ARP caches stay right.
func startInPod(path string, args, env []string, addr netip.Prefix, out io.Writer) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	spec, err := json.Marshal(podProgram{Addr: addr.String(), Path: path, Args: args, Env: env})
	if err != nil {
		return nil, err
	}
	ready, plugged, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer plugged.Close()
	cmd := exec.Command(exe)
	cmd.Env = []string{podExecEnv + "=" + string(spec)}
	cmd.ExtraFiles = []*os.File{ready}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	err = cmd.Start()
	ready.Close()
	if err != nil {
		return nil, err
	}
	if err := plugPod(cmd.Process.Pid, addr.Addr()); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	if _, err := plugged.Write([]byte{1}); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	return cmd, nil
}

// plugPod makes the veth pair of the pod whose process is pid: the node's
// end on the bridge, the pod's end, eth0, in the pod's namespace.
func plugPod(pid int, ip netip.Addr) error {
	host := fmt.Sprintf("lhv%d", pid)
	peer := append(ifInfo(0, 0, 0), slices.Concat(
		attr(syscall.IFLA_IFNAME, cString("eth0")),
		attr(syscall.IFLA_ADDRESS, hardwareAddr(ip)),
		attr(iflaNetNSPID, u32(uint32(pid))))...)
	if err := netlink(syscall.RTM_NEWLINK, syscall.NLM_F_CREATE|syscall.NLM_F_EXCL, ifInfo(0, 0, 0),
		attr(syscall.IFLA_IFNAME, cString(host)),
		attr(syscall.IFLA_LINKINFO,
			attr(iflaInfoKind, cString("veth")),
			attr(iflaInfoData, attr(vethInfoPeer, peer)))); err != nil {
		return fmt.Errorf("making the veth pair of pod process %d: %w", pid, err)
	}
	br, err := net.InterfaceByName(bridgeName)
	if err != nil {
		return err
	}
	link, err := net.InterfaceByName(host)
	if err != nil {
		return err
	}
	if err := netlink(syscall.RTM_NEWLINK, 0, ifInfo(int32(link.Index), syscall.IFF_UP, syscall.IFF_UP),
		attr(syscall.IFLA_MASTER, u32(uint32(br.Index)))); err != nil {
		return fmt.Errorf("plugging %s into %s: %w", host, bridgeName, err)
	}
	return nil
}

// hardwareAddr is the fixed, locally administered hardware address of
// the interface holding the IPv4 address ip on the pod network.
func hardwareAddr(ip netip.Addr) []byte {
	a := ip.As4()
	return []byte{0x02, 0x00, a[0], a[1], a[2], a[3]}
}

// execInPod runs in a pod's new network namespace: it waits until its
// eth0 is there, brings it and the loopback device up with the pod's
// address, and executes the pod's program. It does not return.
func execInPod(specJSON string) {
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "setting up the pod's network: %v\n", err)
		os.Exit(125)
	}
	var spec podProgram
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fail(err)
	}
	addr, err := netip.ParsePrefix(spec.Addr)
	if err != nil {
		fail(err)
	}
	ready := os.NewFile(3, "plugged")
	if n, err := ready.Read(make([]byte, 1)); n != 1 {
		fail(fmt.Errorf("the node did not plug the pod in: %v", err))
	}
	ready.Close()
	for _, name := range []string{"lo", "eth0"} {
		link, err := net.InterfaceByName(name)
		if err != nil {
			fail(err)
		}
		if name == "eth0" {
			if err := addAddr(link.Index, addr); err != nil {
				fail(fmt.Errorf("adding %s to eth0: %w", addr, err))
			}
		}
		if err := linkUp(link.Index); err != nil {
			fail(fmt.Errorf("bringing %s up: %w", name, err))
		}
	}
	fail(syscall.Exec(spec.Path, append([]string{spec.Path}, spec.Args...), spec.Env))
}

// Attribute types syscall does not name.
const (
	iflaInfoKind = 1  // IFLA_INFO_KIND
	iflaInfoData = 2  // IFLA_INFO_DATA
	vethInfoPeer = 1  // VETH_INFO_PEER
	iflaNetNSPID = 19 // IFLA_NET_NS_PID
)

// linkUp brings the link with index up.
func linkUp(index int) error {
	return netlink(syscall.RTM_NEWLINK, 0, ifInfo(int32(index), syscall.IFF_UP, syscall.IFF_UP))
}

// addAddr adds the IPv4 address p to the link with index.
func addAddr(index int, p netip.Prefix) error {
	if !p.Addr().Is4() {
		return fmt.Errorf("%s: only IPv4 addresses are set up", p)
	}
	ip := p.Addr().As4()
	msg := make([]byte, syscall.SizeofIfAddrmsg)
	msg[0] = syscall.AF_INET
	msg[1] = byte(p.Bits())
	binary.NativeEndian.PutUint32(msg[4:], uint32(index))
	return netlink(syscall.RTM_NEWADDR, syscall.NLM_F_CREATE|syscall.NLM_F_EXCL, msg,
		attr(syscall.IFA_LOCAL, ip[:]), attr(syscall.IFA_ADDRESS, ip[:]))
}

// ifInfo is an ifinfomsg.
func ifInfo(index int32, flags, change uint32) []byte {
	b := make([]byte, syscall.SizeofIfInfomsg)
	b[0] = syscall.AF_UNSPEC
	binary.NativeEndian.PutUint32(b[4:], uint32(index))
	binary.NativeEndian.PutUint32(b[8:], flags)
	binary.NativeEndian.PutUint32(b[12:], change)
	return b
}

// attr is a route attribute of type typ holding the payloads one after
// the other (several for a nested attribute), padded as netlink wants.
func attr(typ uint16, payloads ...[]byte) []byte {
	data := slices.Concat(payloads...)
	n := syscall.SizeofRtAttr + len(data)
	b := make([]byte, (n+syscall.RTA_ALIGNTO-1) & ^(syscall.RTA_ALIGNTO-1))
	binary.NativeEndian.PutUint16(b[0:], uint16(n))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[syscall.SizeofRtAttr:], data)
	return b
}

func cString(s string) []byte { return append([]byte(s), 0) }

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// netlink sends one rtnetlink request, its body made of parts, and waits
// for its acknowledgement.
func netlink(msgType, flags uint16, parts ...[]byte) error {
	body := slices.Concat(parts...)
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer syscall.Close(fd)
	kernel := &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink bind: %w", err)
	}
	hdr := make([]byte, syscall.SizeofNlMsghdr)
	binary.NativeEndian.PutUint32(hdr[0:], uint32(syscall.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(hdr[4:], msgType)
	binary.NativeEndian.PutUint16(hdr[6:], syscall.NLM_F_REQUEST|syscall.NLM_F_ACK|flags)
	binary.NativeEndian.PutUint32(hdr[8:], 1)
	if err := syscall.Sendto(fd, append(hdr, body...), 0, kernel); err != nil {
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
			if r.Header.Seq != 1 || r.Header.Type != syscall.NLMSG_ERROR {
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
