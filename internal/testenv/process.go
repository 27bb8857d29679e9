package testenv

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is one child (etcd or kube-apiserver) in its own process group,
// its stdout and stderr appended to a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	logFrom int64         // where this run's output starts in the log
	done    chan struct{} // closed when the process has exited and been reaped
	err     error         // cmd.Wait's result, set before done is closed
}

// The children get SIGKILL when the thread that forked them dies
// (Pdeathsig follows the thread, not the process). A Go thread dies when a
// goroutine exits while locked to it, which network-namespace code does on
// purpose; so every child is forked from one goroutine that stays locked to
// its thread for the life of the test binary, and no other goroutine ever
// runs there.
var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd  *exec.Cmd
	errc chan error
}

func spawn(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range spawner.reqs {
				r.errc <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	spawner.reqs <- spawnRequest{cmd: cmd, errc: errc}
	return <-errc
}

// startProcess starts bin with args; output goes to logPath (appended, so a
// restarted apiserver keeps its earlier log above a marker line).
func startProcess(name, logPath, bin string, args, env []string) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child has its own copy
	from, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "==== testenv: %s %s\n==== testenv: %s %s\n", time.Now().Format(time.RFC3339Nano), name, bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, logFrom: from, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended, with its exit error.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace (at
// once if grace is 0), and waits until the process has been reaped. The
// group is only signalled while its leader has not been reaped, so the pid
// cannot have been reused.
func (p *process) stop(grace time.Duration) {
	if done, _ := p.exited(); done {
		return
	}
	pgid := p.cmd.Process.Pid
	if grace > 0 {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
			return
		case <-time.After(grace):
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}

// exitError describes an unexpected exit, with the log's tail.
func (p *process) exitError(err error) error {
	msg := "exited"
	if err != nil {
		msg = "exited: " + err.Error()
	}
	return fmt.Errorf("%s %s; last lines of %s:\n%s", p.name, msg, p.logPath, p.tail(40))
}

// log returns this run's output so far.
func (p *process) log() ([]byte, error) {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return nil, err
	}
	if p.logFrom <= int64(len(data)) {
		data = data[p.logFrom:]
	}
	return data, nil
}

// tail returns the last n lines of this run's output (for error messages).
func (p *process) tail(n int) string {
	data, err := p.log()
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return tailLines(data, n)
}

func tailLines(data []byte, n int) string {
	data = bytes.TrimRight(data, "\n")
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// addrInUse reports whether this run's output says a port was taken
// between our probe for a free port and the child's bind.
func (p *process) addrInUse() bool {
	data, err := p.log()
	return err == nil && bytes.Contains(data, []byte("address already in use"))
}
