//go:build bench_peers

package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/netpol/netpol/internal/benchstat"
)

// system is one Service proxy under test.
type system struct {
	name string
	// command is the proxy's command line, run inside the namespace.
	command func(b binaries, kubeconfig string) []string
	// rules lists the namespace's ruleset as the system's own tools
	// would (a check after the timed phase, not part of it).
	rules []string
}

// binaries are the proxies' executables; netpolBase (NETPOL_BASE_BIN,
// optional) is an earlier netpol build, run as the system netpol-base
// for before/after ratios in one run.
type binaries struct{ netpol, netpolBase, kubeProxy string }

func netpolAgent(bin, kc string) []string {
	// --no-status: the benchmark has no policies to report on.
	return []string{bin, "agent", "--kubeconfig", kc, "--node-name", nodeName, "--no-status", "--log-format", "json"}
}

// kubeProxyFlags: the mode, and nothing that writes the host's conntrack
// sysctls (nf_conntrack_max is global; 0 leaves every setting as it is).
func kubeProxyFlags(mode string) []string {
	return []string{
		"--proxy-mode=" + mode,
		"--hostname-override=" + nodeName,
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--conntrack-udp-timeout=0",
		"--conntrack-udp-timeout-stream=0",
		"--v=2", // logs each sync's duration
	}
}

var systems = []system{
	{
		name:    "netpol",
		command: func(b binaries, kc string) []string { return netpolAgent(b.netpol, kc) },
		rules:   []string{"nft", "list", "ruleset"},
	},
	{
		name:    "netpol-base",
		command: func(b binaries, kc string) []string { return netpolAgent(b.netpolBase, kc) },
		rules:   []string{"nft", "list", "ruleset"},
	},
	{
		name: "kube-proxy-nftables",
		command: func(b binaries, kc string) []string {
			return append([]string{b.kubeProxy, "--kubeconfig", kc}, kubeProxyFlags("nftables")...)
		},
		rules: []string{"nft", "list", "ruleset"},
	},
	{
		name: "kube-proxy-iptables",
		command: func(b binaries, kc string) []string {
			return append([]string{b.kubeProxy, "--kubeconfig", kc}, kubeProxyFlags("iptables")...)
		},
		rules: []string{"iptables-save", "-t", "nat"},
	},
}

// proc is a running proxy: `ip netns exec NS proxy...` (ip execs the
// proxy, so the pid is the proxy's), in its own process group.
type proc struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
	err    error // after exited

	mu            sync.Mutex
	helperPeakKiB int64  // the largest child (nft, iptables-restore) seen
	helperName    string // its command
	stopSampling  chan struct{}
	samplerDone   chan struct{}
}

func startProc(nsName string, argv []string, log string) (*proc, error) {
	f, err := os.Create(log)
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", log, err)
	}
	defer f.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", nsName}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own group, so that a kill takes its helpers too; SIGKILL if
	// this process dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s in %s: %w", filepath.Base(argv[0]), nsName, err)
	}
	p := &proc{cmd: cmd, log: log, exited: make(chan struct{}), stopSampling: make(chan struct{}), samplerDone: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	go p.sampleHelpers()
	return p, nil
}

// sampleHelpers records, every 100 ms, the peak RSS of the proxy's child
// processes: kube-proxy hands its rules to nft or iptables-restore, whose
// memory is not in its own VmHWM (netpol talks netlink itself). Sampled,
// so a short-lived helper can be missed.
func (p *proc) sampleHelpers() {
	defer close(p.samplerDone)
	pid := p.cmd.Process.Pid
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.stopSampling:
			return
		case <-p.exited:
			return
		case <-tick.C:
		}
		_, self := benchstat.ProcStatusKiB(pid, "VmHWM")
		for _, child := range children(pid) {
			kib, name := benchstat.ProcStatusKiB(child, "VmHWM")
			if name == self {
				continue // forked, not yet exec'd: the proxy's own pages
			}
			p.mu.Lock()
			if kib > p.helperPeakKiB {
				p.helperPeakKiB, p.helperName = kib, name
			}
			p.mu.Unlock()
		}
	}
}

// children lists the pids whose parent is pid (/proc/PID/task/*/children).
func children(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, t := range tasks {
		data, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// peakRSS is the proxy's VmHWM in bytes; an error once it has exited.
func (p *proc) peakRSS() (int64, error) {
	select {
	case <-p.exited:
		return 0, fmt.Errorf("the proxy exited (%v) before its peak RSS was read", p.err)
	default:
	}
	kib, _ := benchstat.ProcStatusKiB(p.cmd.Process.Pid, "VmHWM")
	if kib == 0 {
		return 0, fmt.Errorf("no VmHWM in /proc/%d/status", p.cmd.Process.Pid)
	}
	return kib * 1024, nil
}

func (p *proc) helperPeak() (int64, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.helperPeakKiB * 1024, p.helperName
}

// pause stops the proxy's process group (SIGSTOP): its tables stay, it
// takes no CPU.
func (p *proc) pause() { syscall.Kill(-p.cmd.Process.Pid, syscall.SIGSTOP) }

// resume continues it (SIGCONT).
func (p *proc) resume() { syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT) }

// cpuSeconds is the proxy process's user and system CPU so far.
func (p *proc) cpuSeconds() float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis: utime and
	// stime are the 12th and 13th (fields 14 and 15 of proc(5)).
	_, rest, _ := strings.Cut(string(data), ") ")
	fields := strings.Fields(rest)
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc's CPU times (100 on Linux).
const clockTicks = 100

// quiet waits at least min, then until the proxy used under 2% of a core
// in the last half second (what a resumed proxy catches up on, such as a
// watch's events, is over), at most a minute.
func (p *proc) quiet(ctx context.Context, min time.Duration) error {
	if !sleep(ctx, min) {
		return context.Cause(ctx)
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		before := p.cpuSeconds()
		if !sleep(ctx, 500*time.Millisecond) {
			return context.Cause(ctx)
		}
		if p.cpuSeconds()-before < 0.01 {
			return nil
		}
	}
	return errors.New("the proxy was still busy a minute after it was resumed")
}

// stop kills the process group and waits for the proxy.
func (p *proc) stop() {
	select {
	case <-p.stopSampling:
	default:
		close(p.stopSampling)
	}
	<-p.samplerDone
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		fmt.Fprintf(os.Stderr, "bench-peers: pid %d did not exit 30 s after SIGKILL\n", p.cmd.Process.Pid)
	}
}

// exitedCause is a context cause for the proxy's exit during a phase.
func (p *proc) watch(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-p.exited:
			cancel(fmt.Errorf("the proxy exited: %v; last lines of %s:\n%s", p.err, p.log, tailFile(p.log, 15)))
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}

// countInRules runs the system's ruleset listing inside the namespace and
// counts the lines that mention addr.
func countInRules(ctx context.Context, nsName string, rules []string, addr string) (int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", nsName}, rules...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	took := time.Since(start)
	if err != nil {
		return 0, took, fmt.Errorf("%s in %s: %v: %s", strings.Join(rules, " "), nsName, err, strings.TrimSpace(stderr.String()))
	}
	n := 0
	for _, line := range bytes.Split(out, []byte("\n")) {
		if containsAddr(string(line), addr) {
			n++
		}
	}
	return n, took, nil
}

// containsAddr: addr in line, not as part of a longer address.
func containsAddr(line, addr string) bool {
	digit := func(c byte) bool { return c >= '0' && c <= '9' }
	for i := 0; ; {
		j := strings.Index(line[i:], addr)
		if j < 0 {
			return false
		}
		begin, end := i+j, i+j+len(addr)
		if (begin == 0 || !(digit(line[begin-1]) || line[begin-1] == '.')) &&
			(end == len(line) || !digit(line[end])) {
			return true
		}
		i = begin + 1
	}
}

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var errNotFinished = errors.New("did not finish")
