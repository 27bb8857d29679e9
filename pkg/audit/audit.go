// Package audit is the verdict log's userspace side: it reads the copies
// of the first packets that the policy table's deciding rules send to an
// NFLOG group (compiler.Audit), names each by its rule's attribution and
// its addresses by their pods, and writes one JSON line per decision,
// within a rate, with repeats folded. Nothing here touches traffic: a
// line not written is counted, never a packet held.
package audit

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Line is one line of the verdict log: a decision of one side of a new
// connection. Tier, Policy, Rule and Action are what `netpol explain -o
// json` gives the deciding side; Src and Dst are namespace/pod for a
// pod's address, node/NAME for a node's, else the address.
type Line struct {
	Time      time.Time `json:"time"`
	Node      string    `json:"node"`
	Verdict   string    `json:"verdict"` // allow or deny
	Direction string    `json:"direction"`
	Src       string    `json:"src"`
	Dst       string    `json:"dst"`
	SrcIP     string    `json:"srcIP"`
	DstIP     string    `json:"dstIP"`
	Protocol  string    `json:"protocol"`
	Port      uint16    `json:"port"`
	Tier      string    `json:"tier"`
	Policy    string    `json:"policy,omitempty"`
	Rule      string    `json:"rule,omitempty"`
	Action    string    `json:"action"`
	// Staged marks a staged policy's line (compiler.Options.Staged): the
	// connection was decided Enforced, and Verdict is what the node would
	// decide were the staged policies enforced; Tier, Policy, Rule and
	// Action name the staged policy's rule that makes the difference.
	Staged   bool   `json:"staged,omitempty"`
	Enforced string `json:"enforced,omitempty"`
	// Repeats is how many more times the same decision (source,
	// destination, protocol, port, verdict) was made within a second of
	// the line before it; a line with repeats is written when that
	// second ends.
	Repeats int `json:"repeats,omitempty"`
}

// LoggerOptions tune a Logger.
type LoggerOptions struct {
	// Rate is the most lines a second (default DefaultRate); Burst the
	// most at once (default twice Rate).
	Rate  float64
	Burst int
	// Window is how long the same decision is folded into one line's
	// repeats (default a second).
	Window time.Duration
	// Now is the clock (tests).
	Now func() time.Time
}

// DefaultRate is the lines a second a Logger writes unless told.
const DefaultRate = 1000

// Stats count what a Logger did.
type Stats struct {
	Written, Folded atomic.Uint64
	// Dropped are lines not written: over the rate, or lost before they
	// reached the Logger (Reader: the kernel's copies the socket could not
	// take, copies that would not parse).
	Dropped atomic.Uint64
}

// Logger writes Lines to w, folding repeats and holding the rate. It is
// safe for concurrent use.
type Logger struct {
	w      io.Writer
	opts   LoggerOptions
	limit  *rate.Limiter
	Stats  Stats
	mu     sync.Mutex
	window map[foldKey]*folded
	wmu    sync.Mutex // one line at a time to w
	stop   chan struct{}
	done   sync.WaitGroup
}

type foldKey struct {
	src, dst, protocol, verdict string
	port                        uint16
	staged                      bool
}

// folded is a decision made again within its window: the last line and
// how many.
type folded struct {
	since time.Time
	last  Line
	n     int
}

// NewLogger writes to w (a file that rotates, stdout) until Close.
func NewLogger(w io.Writer, opts LoggerOptions) *Logger {
	if opts.Rate <= 0 {
		opts.Rate = DefaultRate
	}
	if opts.Burst <= 0 {
		opts.Burst = int(2 * opts.Rate)
	}
	if opts.Window <= 0 {
		opts.Window = time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	l := &Logger{w: w, opts: opts, limit: rate.NewLimiter(rate.Limit(opts.Rate), opts.Burst), window: map[foldKey]*folded{}, stop: make(chan struct{})}
	l.done.Go(func() {
		tick := time.NewTicker(opts.Window / 4)
		defer tick.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-tick.C:
				l.flush(false)
			}
		}
	})
	return l
}

// Log writes line, or folds it into the line of the same decision made
// within the window.
func (l *Logger) Log(line Line) {
	key := foldKey{line.Src, line.Dst, line.Protocol, line.Verdict, line.Port, line.Staged}
	l.mu.Lock()
	if f, ok := l.window[key]; ok && line.Time.Sub(f.since) < l.opts.Window {
		f.last, f.n = line, f.n+1
		l.mu.Unlock()
		l.Stats.Folded.Add(1)
		return
	}
	l.window[key] = &folded{since: line.Time, last: line}
	l.mu.Unlock()
	l.write(line)
}

// flush writes the folded lines whose window ended (all of them with
// final), each with its repeats.
func (l *Logger) flush(final bool) {
	now := l.opts.Now()
	var out []Line
	l.mu.Lock()
	for key, f := range l.window {
		if !final && now.Sub(f.since) < l.opts.Window {
			continue
		}
		delete(l.window, key)
		if f.n > 0 {
			line := f.last
			line.Repeats = f.n
			out = append(out, line)
		}
	}
	l.mu.Unlock()
	for _, line := range out {
		l.write(line)
	}
}

func (l *Logger) write(line Line) {
	if !l.limit.AllowN(l.opts.Now(), 1) {
		l.Stats.Dropped.Add(1)
		return
	}
	data, err := json.Marshal(line)
	if err != nil {
		l.Stats.Dropped.Add(1)
		return
	}
	l.wmu.Lock()
	_, err = l.w.Write(append(data, '\n'))
	l.wmu.Unlock()
	if err != nil {
		l.Stats.Dropped.Add(1)
		return
	}
	l.Stats.Written.Add(1)
}

// Close writes the folded lines and stops; w is the caller's to close.
func (l *Logger) Close() {
	close(l.stop)
	l.done.Wait()
	l.flush(true)
}

// ParseLines reads a verdict log's lines (one JSON object a line; blank
// lines skipped).
func ParseLines(text string) ([]Line, error) {
	var out []Line
	for _, s := range strings.Split(text, "\n") {
		if strings.TrimSpace(s) == "" {
			continue
		}
		var line Line
		if err := json.Unmarshal([]byte(s), &line); err != nil {
			return out, fmt.Errorf("verdict log line %q: %w", s, err)
		}
		out = append(out, line)
	}
	return out, nil
}
