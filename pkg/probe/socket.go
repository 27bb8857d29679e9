// Package probe is netpol's probe protocol, shared by the lab (servers and
// clients inside the lab's network namespaces) and by `netpol probe` in a
// real cluster's pods: a server on an address, port and protocol answers
// with its owner's name (TCP and SCTP write it and close, UDP replies to
// each datagram); a client exchange connects (or sends one datagram) and
// reads the answer, and a failure is classified as a result (timeout,
// refused, ...).
package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/internal/nsexec"
)

// maxReply bounds what a probe reads: replies are a pod's namespace/name.
const maxReply = 512

// inNetNS runs fn inside the network namespace h; h <= 0 (netns.None())
// is the caller's own.
func inNetNS(h netns.NsHandle, fn func() error) error { return nsexec.In(h, fn) }

func sockaddr(a netip.Addr, port int) unix.Sockaddr {
	if a.Is4() {
		return &unix.SockaddrInet4{Port: port, Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Port: port, Addr: a.As16()}
}

// socketKind maps a probe protocol to socket(2) arguments. SCTP uses the
// one-to-one (SOCK_STREAM) style, which behaves like TCP for connect,
// accept, read and write.
func socketKind(p corev1.Protocol) (sotype, proto int, err error) {
	switch p {
	case corev1.ProtocolTCP:
		return unix.SOCK_STREAM, unix.IPPROTO_TCP, nil
	case corev1.ProtocolUDP:
		return unix.SOCK_DGRAM, unix.IPPROTO_UDP, nil
	case corev1.ProtocolSCTP:
		return unix.SOCK_STREAM, unix.IPPROTO_SCTP, nil
	}
	return 0, 0, fmt.Errorf("unknown protocol %q", p)
}

// boundSocket makes a socket inside the namespace h, bound to addr:port
// (port 0: any), and hands it over as an *os.File for net.File*. Only
// socket(2) needs the thread to be in h: the socket then stays there, so
// binding, connecting and I/O happen on any thread.
func boundSocket(h netns.NsHandle, addr netip.Addr, port int, protocol corev1.Protocol, reuse bool) (*os.File, error) {
	sotype, proto, err := socketKind(protocol)
	if err != nil {
		return nil, err
	}
	af, family := unix.AF_INET, "IPv4"
	if !addr.Is4() {
		af, family = unix.AF_INET6, "IPv6"
	}
	fd := -1
	if err := inNetNS(h, func() error {
		var err error
		fd, err = unix.Socket(af, sotype|unix.SOCK_CLOEXEC, proto)
		return err
	}); err != nil {
		return nil, fmt.Errorf("socket(%s, %s): %w", family, protocol, err)
	}
	setup := func() error {
		if reuse {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
				return fmt.Errorf("SO_REUSEADDR: %w", err)
			}
		}
		if af == unix.AF_INET6 { // an IPv6 socket never stands for IPv4 too
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
				return fmt.Errorf("IPV6_V6ONLY: %w", err)
			}
		}
		if err := unix.Bind(fd, sockaddr(addr, port)); err != nil {
			return fmt.Errorf("bind %s: %w", netip.AddrPortFrom(addr, uint16(port)), err)
		}
		return nil
	}
	if err := setup(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "probe-socket"), nil
}

// Exchange is one probe from src (inside namespace h) to dst: TCP and SCTP
// connect and read what the server writes before closing; UDP sends a
// datagram and reads the answer. src's port 0 is an ephemeral one (another
// is bound with SO_REUSEADDR, so that it can be reused at once); an
// unspecified src address lets the kernel pick it. It returns the reply and
// the source the connection used, or the error that Classify names.
func Exchange(ctx context.Context, h netns.NsHandle, src, dst netip.AddrPort, protocol corev1.Protocol, timeout time.Duration) (string, netip.AddrPort, error) {
	file, err := boundSocket(h, src.Addr(), int(src.Port()), protocol, src.Port() != 0)
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	conn, err := net.FileConn(file) // a non-blocking duplicate in Go's poller
	file.Close()
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("wrapping socket: %w", err)
	}
	defer conn.Close()
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	err = connect(conn, sockaddr(dst.Addr(), int(dst.Port())))
	local := localAddr(conn)
	if err != nil {
		return "", local, err
	}
	if protocol == corev1.ProtocolUDP {
		if _, err := conn.Write([]byte("probe")); err != nil {
			return "", local, err
		}
		buf := make([]byte, maxReply)
		n, err := conn.Read(buf)
		if err != nil {
			return "", local, err
		}
		return string(buf[:n]), local, nil
	}
	reply, err := io.ReadAll(io.LimitReader(conn, maxReply))
	if err != nil && len(reply) == 0 {
		return "", local, err
	}
	return string(reply), local, nil
}

// localAddr is the socket's address as the kernel has it now (net.FileConn
// read it before connect chose it).
func localAddr(conn net.Conn) netip.AddrPort {
	rc, err := conn.(syscall.Conn).SyscallConn()
	if err != nil {
		return netip.AddrPort{}
	}
	var sa unix.Sockaddr
	rc.Control(func(fd uintptr) { sa, _ = unix.Getsockname(int(fd)) })
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

// connect starts a non-blocking connect and waits for it under the
// connection's deadline, as net.Dialer does internally.
func connect(conn net.Conn, sa unix.Sockaddr) error {
	rc, err := conn.(syscall.Conn).SyscallConn()
	if err != nil {
		return err
	}
	var connErr error
	if err := rc.Control(func(fd uintptr) { connErr = unix.Connect(int(fd), sa) }); err != nil {
		return err
	}
	switch {
	case connErr == nil, errors.Is(connErr, unix.EISCONN):
		return nil
	case !errors.Is(connErr, unix.EINPROGRESS):
		return connErr
	}
	err = rc.Write(func(fd uintptr) bool {
		soErr, gerr := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		if gerr != nil {
			connErr = gerr
			return true
		}
		switch e := syscall.Errno(soErr); e {
		case 0:
			// The poller can wake us before the handshake is done (an
			// unconnected socket polls writable): connected only once
			// there is a peer.
			if _, perr := unix.Getpeername(int(fd)); perr != nil {
				return false
			}
			connErr = nil
			return true
		case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
			return false
		default:
			connErr = e
			return true
		}
	})
	if err != nil {
		return err
	}
	return connErr
}

// Results of a probe.
const (
	ResultOK          = "ok"
	ResultTimeout     = "timeout"
	ResultRefused     = "refused"
	ResultUnreachable = "unreachable"
	// ResultRejected: a rule on the way out of the source refused to send
	// (EPERM), as a drop in an output hook does.
	ResultRejected = "rejected"
)

// ErrorPrefix starts the result of a probe that could not be made (no
// socket, ...): a problem of the prober, never a policy answer.
const ErrorPrefix = "error: "

// Classify names a failed exchange.
func Classify(err error) string {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return ResultTimeout
	case errors.Is(err, unix.ECONNREFUSED):
		return ResultRefused
	case errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.ENETUNREACH),
		errors.Is(err, unix.EHOSTDOWN), errors.Is(err, unix.ENETDOWN):
		return ResultUnreachable
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return ResultRejected
	}
	return ErrorPrefix + err.Error()
}
