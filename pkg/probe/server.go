package probe

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/l4"
)

// Server answers probes to one address and port of a pod with the pod's
// namespace/name (its owner): TCP and SCTP write it and close, UDP replies
// to each datagram with it.
type Server struct {
	Owner string
	Addr  netip.Addr
	Probe l4.Port
	close func() error
	done  sync.WaitGroup
}

// Serve starts a server inside namespace h (netns.None(): this process's).
func Serve(h netns.NsHandle, owner string, addr netip.Addr, probe l4.Port) (*Server, error) {
	s := &Server{Owner: owner, Addr: addr, Probe: probe}
	reply := []byte(owner)
	if probe.Protocol == corev1.ProtocolUDP {
		pc, err := ListenPacket(h, addr, int(probe.Port))
		if err != nil {
			return nil, fmt.Errorf("serving %s on %s: %w", probe, addr, err)
		}
		s.close = pc.Close
		s.done.Go(func() { answerDatagrams(replyFromDst(pc, addr.Is4()), reply) })
		return s, nil
	}
	ln, err := Listen(h, addr, int(probe.Port), probe.Protocol)
	if err != nil {
		return nil, fmt.Errorf("serving %s on %s: %w", probe, addr, err)
	}
	s.close = ln.Close
	s.done.Go(func() { answerConnections(ln, reply) })
	return s, nil
}

// Listen makes a listening stream socket (TCP, SCTP) inside namespace h,
// bound to addr:port with SO_REUSEADDR, as probe servers have theirs: for
// other servers on a pod's address (the lab's DNS server).
func Listen(h netns.NsHandle, addr netip.Addr, port int, protocol corev1.Protocol) (net.Listener, error) {
	if protocol == corev1.ProtocolUDP {
		return nil, fmt.Errorf("listen: %s is not a stream protocol", protocol)
	}
	file, err := boundSocket(h, addr, port, protocol, true)
	if err != nil {
		return nil, err
	}
	defer file.Close() // net.File* keep their own duplicate
	if err := unix.Listen(int(file.Fd()), 128); err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	return net.FileListener(file)
}

// ListenPacket makes a UDP socket inside namespace h, bound to addr:port
// with SO_REUSEADDR, as probe servers have theirs.
func ListenPacket(h netns.NsHandle, addr netip.Addr, port int) (net.PacketConn, error) {
	file, err := boundSocket(h, addr, port, corev1.ProtocolUDP, true)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	return net.FilePacketConn(file)
}

// datagramConn reads datagrams with the address each was sent to, and
// writes from a given address.
type datagramConn interface {
	readFrom(b []byte) (from net.Addr, dst net.IP, err error)
	writeTo(b []byte, src net.IP, to net.Addr) error
}

// replyFromDst wraps a UDP socket of one family so that a reply leaves
// from the address the request came to: on a wildcard address of a host
// with several (a host-network pod: its node's address, and the gateway
// address of each local pod's veth) routing would pick the source, and
// the client's socket takes no answer from another address than the one
// it sent to.
func replyFromDst(pc net.PacketConn, v4 bool) datagramConn {
	if v4 {
		c := ipv4.NewPacketConn(pc)
		c.SetControlMessage(ipv4.FlagDst, true)
		return ipv4Conn{c}
	}
	c := ipv6.NewPacketConn(pc)
	c.SetControlMessage(ipv6.FlagDst, true)
	return ipv6Conn{c}
}

type ipv4Conn struct{ *ipv4.PacketConn }

func (c ipv4Conn) readFrom(b []byte) (net.Addr, net.IP, error) {
	_, cm, from, err := c.ReadFrom(b)
	if cm == nil {
		return from, nil, err
	}
	return from, cm.Dst, err
}

func (c ipv4Conn) writeTo(b []byte, src net.IP, to net.Addr) error {
	_, err := c.WriteTo(b, &ipv4.ControlMessage{Src: src}, to)
	return err
}

type ipv6Conn struct{ *ipv6.PacketConn }

func (c ipv6Conn) readFrom(b []byte) (net.Addr, net.IP, error) {
	_, cm, from, err := c.ReadFrom(b)
	if cm == nil {
		return from, nil, err
	}
	return from, cm.Dst, err
}

func (c ipv6Conn) writeTo(b []byte, src net.IP, to net.Addr) error {
	_, err := c.WriteTo(b, &ipv6.ControlMessage{Src: src}, to)
	return err
}

func answerDatagrams(pc datagramConn, reply []byte) {
	buf := make([]byte, 2048)
	for {
		from, dst, err := pc.readFrom(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue // e.g. an ICMP error for an earlier reply
		}
		pc.writeTo(reply, dst, from)
	}
}

func answerConnections(ln net.Listener, reply []byte) {
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond) // out of descriptors: let probes finish
			continue
		}
		c.SetWriteDeadline(time.Now().Add(time.Second))
		c.Write(reply)
		c.Close()
	}
}

// Stop closes the server's socket and waits for it to finish.
func (s *Server) Stop() error {
	err := s.close()
	s.done.Wait()
	if err != nil {
		return fmt.Errorf("stopping %s server of %s on %s: %w", s.Probe, s.Owner, s.Addr, err)
	}
	return nil
}

// StartServers serves every probe on every address, all or nothing.
func StartServers(h netns.NsHandle, owner string, addrs []netip.Addr, probes []l4.Port) ([]*Server, error) {
	var servers []*Server
	for _, a := range addrs {
		for _, p := range probes {
			s, err := Serve(h, owner, a, p)
			if err != nil {
				return nil, errors.Join(err, StopServers(servers))
			}
			servers = append(servers, s)
		}
	}
	return servers, nil
}

// StopServers stops every server, returning every error.
func StopServers(servers []*Server) error {
	var errs []error
	for _, s := range servers {
		errs = append(errs, s.Stop())
	}
	return errors.Join(errs...)
}
