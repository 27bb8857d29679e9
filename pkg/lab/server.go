package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/eval"
)

// server answers probes to one address and port of a pod with the pod's
// namespace/name: TCP and SCTP write it and close, UDP replies to each
// datagram with it.
type server struct {
	owner string
	addr  netip.Addr
	probe eval.Probe
	close func() error
	done  sync.WaitGroup
}

// serve starts a server inside namespace h.
func serve(h netns.NsHandle, owner string, addr netip.Addr, probe eval.Probe) (*server, error) {
	s := &server{owner: owner, addr: addr, probe: probe}
	file, err := boundSocket(h, addr, int(probe.Port), probe.Protocol, true)
	if err != nil {
		return nil, fmt.Errorf("serving %s on %s: %w", probe, addr, err)
	}
	defer file.Close() // net.File* keep their own duplicate
	reply := []byte(owner)
	if probe.Protocol == corev1.ProtocolUDP {
		pc, err := net.FilePacketConn(file)
		if err != nil {
			return nil, fmt.Errorf("serving %s on %s: %w", probe, addr, err)
		}
		s.close = pc.Close
		s.done.Go(func() { answerDatagrams(pc, reply) })
		return s, nil
	}
	if err := unix.Listen(int(file.Fd()), 128); err != nil {
		return nil, fmt.Errorf("serving %s on %s: listen: %w", probe, addr, err)
	}
	ln, err := net.FileListener(file)
	if err != nil {
		return nil, fmt.Errorf("serving %s on %s: %w", probe, addr, err)
	}
	s.close = ln.Close
	s.done.Go(func() { answerConnections(ln, reply) })
	return s, nil
}

func answerDatagrams(pc net.PacketConn, reply []byte) {
	buf := make([]byte, 2048)
	for {
		_, from, err := pc.ReadFrom(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue // e.g. an ICMP error for an earlier reply
		}
		pc.WriteTo(reply, from)
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

func (s *server) stop() error {
	err := s.close()
	s.done.Wait()
	if err != nil {
		return fmt.Errorf("stopping %s server of %s on %s: %w", s.probe, s.owner, s.addr, err)
	}
	return nil
}

// startServers serves every probe on every address, all or nothing.
func startServers(h netns.NsHandle, owner string, addrs []netip.Addr, probes []eval.Probe) ([]*server, error) {
	var servers []*server
	for _, a := range addrs {
		for _, p := range probes {
			s, err := serve(h, owner, a, p)
			if err != nil {
				return nil, errors.Join(err, stopServers(servers))
			}
			servers = append(servers, s)
		}
	}
	return servers, nil
}

func stopServers(servers []*server) error {
	var errs []error
	for _, s := range servers {
		errs = append(errs, s.stop())
	}
	return errors.Join(errs...)
}
