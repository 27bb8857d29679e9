//go:build bench_peers

package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/internal/nsexec"
)

// nsPrefix starts every namespace this benchmark makes; the pid after it
// lets a later run remove what a killed run left. Not the lab's "netpol-"
// prefix: `netpol lab down --all` must not take ours, nor we the lab's.
const nsPrefix = "peers-"

// apiPort is where the API server answers inside a namespace (127.0.0.1):
// a forwarder to the testenv apiserver on the host's loopback, so the
// serving certificate (127.0.0.1) verifies and the apiserver stays bound
// to the host's loopback only.
const apiPort = 6443

// node is one system's network namespace: the namespace, the API
// forwarder and the endpoints' listener in it.
type node struct {
	name    string
	handle  netns.NsHandle
	closers []func()
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNode makes the namespace: loopback up; every address of endpointRange
// local (so one listener serves every endpoint of every Service); the
// Service CIDR routed to svc0, a veth whose peer is down, so that a
// connection to a ClusterIP nobody has programmed yet goes nowhere (it
// times out) instead of leaving the namespace. On error nothing is left.
func newNode(name, apiUpstream string) (n *node, err error) {
	if err := ip("netns", "add", name); err != nil {
		return nil, fmt.Errorf("creating network namespace %s: %w", name, err)
	}
	n = &node{name: name, handle: netns.None()}
	defer func() {
		if err != nil {
			n.close()
			n = nil
		}
	}()
	n.closers = append(n.closers, func() {
		if err := ip("netns", "del", name); err != nil {
			fmt.Fprintf(os.Stderr, "bench-peers: removing network namespace %s: %v\n", name, err)
		}
	})
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "svc0", "type", "veth", "peer", "name", "svc1"},
		{"link", "set", "svc0", "arp", "off", "up"},
		{"addr", "add", nodeIP + "/32", "dev", "svc0"},
		{"route", "add", "10.96.0.0/16", "dev", "svc0", "src", nodeIP},
		{"route", "add", "local", endpointRange, "dev", "lo"},
	} {
		if err := ip(append([]string{"-n", name}, args...)...); err != nil {
			return nil, fmt.Errorf("setting up network namespace %s: %w", name, err)
		}
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", name, err)
	}
	n.handle = h
	n.closers = append(n.closers, func() { h.Close() })
	if err := n.forwardAPI(apiUpstream); err != nil {
		return nil, err
	}
	if err := n.serveEndpoints(); err != nil {
		return nil, err
	}
	return n, nil
}

// close undoes newNode, last step first.
func (n *node) close() {
	for i := len(n.closers) - 1; i >= 0; i-- {
		n.closers[i]()
	}
	n.closers = nil
}

// listen opens a TCP listener inside the namespace (the socket stays there).
func (n *node) listen(addr string) (net.Listener, error) {
	var l net.Listener
	err := nsexec.In(n.handle, func() (err error) {
		l, err = net.Listen("tcp4", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s in network namespace %s: %w", addr, n.name, err)
	}
	return l, nil
}

// forwardAPI copies connections to 127.0.0.1:apiPort in the namespace to
// upstream on the host's loopback.
func (n *node) forwardAPI(upstream string) error {
	l, err := n.listen(net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort)))
	if err != nil {
		return err
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
		wg    sync.WaitGroup
	)
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				up, err := net.DialTimeout("tcp", upstream, 10*time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				track(c, true)
				track(up, true)
				defer track(c, false)
				defer track(up, false)
				done := make(chan struct{})
				go func() {
					io.Copy(up, c)
					up.(*net.TCPConn).CloseWrite()
					close(done)
				}()
				io.Copy(c, up)
				c.(*net.TCPConn).CloseWrite()
				<-done
			})
		}
	})
	n.closers = append(n.closers, func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return nil
}

// serveEndpoints answers every endpoint: accept, write one byte, close.
func (n *node) serveEndpoints() error {
	l, err := n.listen(fmt.Sprintf("0.0.0.0:%d", endpointPort))
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.SetWriteDeadline(time.Now().Add(time.Second))
				c.Write([]byte{'x'})
				c.Close()
			}
		})
	}
	n.closers = append(n.closers, func() { l.Close(); wg.Wait() })
	return nil
}

// firstConnect opens a new TCP connection to addr from inside the
// namespace every interval, each allowed patience to complete, and
// returns the time the first one that completed was started: the frontend
// was programmed between the start of the last attempt that timed out and
// that time. Each attempt is a new connection (a new conntrack entry), so
// a SYN sent before the rules existed cannot hide a later change.
// Non-blocking sockets on one thread in the namespace: the resolution is
// the interval, not the patience.
func (n *node) firstConnect(ctx context.Context, addr netip.AddrPort, interval, patience time.Duration) (time.Time, int, error) {
	var (
		at       time.Time
		attempts int
	)
	err := nsexec.In(n.handle, func() error {
		type attempt struct {
			fd   int
			sent time.Time
		}
		var pending []attempt
		defer func() {
			for _, a := range pending {
				unix.Close(a.fd)
			}
		}()
		sa := &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
		var fds []unix.PollFd
		next := time.Now()
		for {
			if err := ctx.Err(); err != nil {
				return context.Cause(ctx)
			}
			if now := time.Now(); !now.Before(next) {
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					return fmt.Errorf("probe socket: %w", err)
				}
				attempts++
				sent := time.Now()
				switch err := unix.Connect(fd, sa); {
				case err == nil:
					abortClose(fd)
					at = sent
					return nil
				case errors.Is(err, unix.EINPROGRESS):
					pending = append(pending, attempt{fd, sent})
				default: // refused, unreachable: not programmed (yet)
					unix.Close(fd)
				}
				next = sent.Add(interval)
			}
			fds = fds[:0]
			for _, a := range pending {
				fds = append(fds, unix.PollFd{Fd: int32(a.fd), Events: unix.POLLOUT})
			}
			ts := unix.NsecToTimespec(max(int64(time.Until(next)), 0))
			if _, err := unix.Ppoll(fds, &ts, nil); err != nil && !errors.Is(err, unix.EINTR) {
				return fmt.Errorf("probe ppoll: %w", err)
			}
			kept := pending[:0]
			for i, a := range pending {
				if fds[i].Revents != 0 {
					soErr, err := unix.GetsockoptInt(a.fd, unix.SOL_SOCKET, unix.SO_ERROR)
					if err == nil && soErr == 0 && fds[i].Revents&unix.POLLOUT != 0 {
						// pending is in start order: the earliest success.
						abortClose(a.fd)
						at = a.sent
						for _, b := range pending[i+1:] {
							unix.Close(b.fd)
						}
						pending = kept
						return nil
					}
					unix.Close(a.fd)
					continue
				}
				if time.Since(a.sent) > patience {
					unix.Close(a.fd)
					continue
				}
				kept = append(kept, a)
			}
			pending = kept
		}
	})
	return at, attempts, err
}

// abortClose closes with a reset: no TIME_WAIT left behind.
func abortClose(fd int) {
	unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	unix.Close(fd)
}

// connRate opens TCP connections to addr from inside the namespace for
// window, from `workers` clients each on its own thread in the namespace:
// connect (the proxy's DNAT picks an endpoint), read the endpoint's byte,
// close with a reset. It returns completed connections per second, the
// failures and the first failure.
func (n *node) connRate(ctx context.Context, addr netip.AddrPort, window time.Duration, workers int) (float64, int64, error) {
	var (
		ok, failed atomic.Int64
		firstErr   error
		errOnce    sync.Once
		wg         sync.WaitGroup
	)
	deadline := time.Now().Add(window)
	for range workers {
		wg.Go(func() {
			err := nsexec.In(n.handle, func() error {
				d := net.Dialer{Timeout: time.Second}
				buf := make([]byte, 1)
				for time.Now().Before(deadline) && ctx.Err() == nil {
					c, err := d.Dial("tcp4", addr.String())
					if err == nil {
						c.SetReadDeadline(time.Now().Add(time.Second))
						_, err = io.ReadFull(c, buf)
						c.(*net.TCPConn).SetLinger(0)
						c.Close()
					}
					if err != nil {
						failed.Add(1)
						errOnce.Do(func() { firstErr = err })
						continue
					}
					ok.Add(1)
				}
				return nil
			})
			if err != nil {
				failed.Add(1)
				errOnce.Do(func() { firstErr = err })
			}
		})
	}
	wg.Wait()
	return float64(ok.Load()) / window.Seconds(), failed.Load(), firstErr
}

// removeStaleNamespaces deletes the namespaces of earlier runs whose
// process is gone (killed before its cleanup).
func removeStaleNamespaces() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), nsPrefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			if err := ip("netns", "del", e.Name()); err != nil {
				fmt.Fprintf(os.Stderr, "bench-peers: removing stale %s: %v\n", filepath.Join("/run/netns", e.Name()), err)
			}
		}
	}
}

// netStats reads the namespace's conntrack statistics (summed over CPUs)
// and TCP counters, to explain failed connections: name -> value.
func (n *node) netStats() map[string]int64 {
	out := map[string]int64{}
	nsexec.In(n.handle, func() error {
		// thread-self: this thread is the one in the namespace.
		if data, err := os.ReadFile("/proc/thread-self/net/stat/nf_conntrack"); err == nil {
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			head := strings.Fields(lines[0])
			for _, l := range lines[1:] {
				for i, f := range strings.Fields(l) {
					if v, err := strconv.ParseInt(f, 16, 64); err == nil && i < len(head) && head[i] != "entries" {
						out["ct_"+head[i]] += v
					}
				}
			}
		}
		for _, file := range []string{"/proc/thread-self/net/netstat", "/proc/thread-self/net/snmp"} {
			data, err := os.ReadFile(file)
			if err != nil {
				continue
			}
			lines := strings.Split(string(data), "\n")
			for i := 0; i+1 < len(lines); i += 2 {
				names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
				if len(names) == 0 || len(names) != len(values) || (names[0] != "TcpExt:" && names[0] != "Tcp:") {
					continue
				}
				for j := 1; j < len(names); j++ {
					if v, err := strconv.ParseInt(values[j], 10, 64); err == nil {
						out[strings.TrimSuffix(names[0], ":")+"_"+names[j]] = v
					}
				}
			}
		}
		return nil
	})
	return out
}

// statsDelta lists the counters that moved, for a log line.
func statsDelta(before, after map[string]int64, keys ...string) string {
	var parts []string
	for _, k := range keys {
		if d := after[k] - before[k]; d != 0 {
			parts = append(parts, fmt.Sprintf("%s +%d", k, d))
		}
	}
	if len(parts) == 0 {
		return "none moved"
	}
	return strings.Join(parts, ", ")
}

// flushConntrack empties the namespace's connection tracking table. The
// probes sent before a ClusterIP was programmed left unanswered, un-NATed
// entries (SYN_SENT, 2 minutes); a later connection from the same source
// port would match one and go nowhere.
func (n *node) flushConntrack() error {
	h, err := netlink.NewHandleAt(n.handle)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", n.name, err)
	}
	defer h.Close()
	if err := h.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		return fmt.Errorf("flushing conntrack in %s: %w", n.name, err)
	}
	return nil
}
