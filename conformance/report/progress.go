package report

import (
	"fmt"
	"io"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/netpol/netpol/conformance"
)

// Progress reports a run as it goes. On a terminal it keeps one line up to
// date ("\r" and erase-to-end): cases done of the total, mismatches so far,
// the ETA and the last case; a failing case also gets a line of its own
// that stays. Otherwise (a pipe, a CI log) it writes one plain line per
// case. It writes only to its io.Writer; its methods may be called from
// several goroutines.
type Progress struct {
	mu         sync.Mutex
	w          io.Writer
	total      int
	terminal   bool
	done       int
	failed     int
	mismatches int
	start      time.Time
	now        func() time.Time
	finished   bool
}

// NewProgress starts the clock for total cases (0 when unknown: no ETA).
// isTerminal chooses the live line; the caller decides it (cmd/ checks
// the file descriptor, e.g. with golang.org/x/term).
func NewProgress(w io.Writer, total int, isTerminal bool) *Progress {
	return newProgress(w, total, isTerminal, time.Now)
}

func newProgress(w io.Writer, total int, isTerminal bool, now func() time.Time) *Progress {
	p := &Progress{w: w, total: total, terminal: isTerminal, now: now, start: now()}
	if isTerminal {
		p.draw("starting")
	}
	return p
}

// lineWidth bounds the live line so it does not wrap on an 80-column
// terminal (a wrapped line cannot be rewritten with "\r").
const lineWidth = 79

// CaseDone records one finished case.
func (p *Progress) CaseDone(res conformance.CaseResult) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	p.done++
	n := caseMismatches(res)
	p.mismatches += n
	if !res.Passed {
		p.failed++
	}
	status := "PASS"
	detail := ""
	switch {
	case res.Error != "":
		status, detail = "FAIL", ": error: "+res.Error
	case !res.Passed:
		status, detail = "FAIL", fmt.Sprintf(": %d mismatching cells", n)
	}
	if !p.terminal {
		fmt.Fprintf(p.w, "%s %s %s (%s)%s\n", p.counter(), status, res.Name, duration(res.DurationSeconds), detail)
		return
	}
	if !res.Passed {
		// A failure stays on the screen above the live line.
		fmt.Fprintf(p.w, "\r\x1b[K%s %s%s\n", status, res.Name, detail)
	}
	p.draw(res.Name)
}

// Note writes one line of its own (what the runner is doing); on a
// terminal the live line is drawn again below it.
func (p *Progress) Note(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished || !p.terminal {
		fmt.Fprintln(p.w, line)
		return
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s\n", line)
	p.draw("")
}

// Done ends the report: on a terminal the live line is finished with a
// newline, otherwise a closing line is written. Later calls do nothing.
func (p *Progress) Done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	p.finished = true
	elapsed := p.now().Sub(p.start).Round(time.Second)
	line := fmt.Sprintf("%d cases done, %d failed, %d mismatches, in %s", p.done, p.failed, p.mismatches, elapsed)
	if p.terminal {
		fmt.Fprintf(p.w, "\r\x1b[K%s\n", line)
		return
	}
	fmt.Fprintln(p.w, line)
}

// counter is "[ 12/400]" (or "[12]" with no total).
func (p *Progress) counter() string {
	if p.total <= 0 {
		return fmt.Sprintf("[%d]", p.done)
	}
	width := len(fmt.Sprint(p.total))
	return fmt.Sprintf("[%*d/%d]", width, p.done, p.total)
}

func (p *Progress) draw(last string) {
	line := fmt.Sprintf("%s %d mismatches", p.counter(), p.mismatches)
	if eta, ok := p.eta(); ok {
		line += " · ETA " + eta.String()
	}
	if rest := lineWidth - utf8.RuneCountInString(line) - 3; rest > 8 {
		line += " · " + truncate(last, rest)
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s", line)
}

// eta extrapolates the time per case so far.
func (p *Progress) eta() (time.Duration, bool) {
	if p.total <= 0 || p.done == 0 || p.done > p.total {
		return 0, false
	}
	elapsed := p.now().Sub(p.start)
	left := time.Duration(float64(elapsed) / float64(p.done) * float64(p.total-p.done))
	return left.Round(time.Second), true
}

func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

func caseMismatches(c conformance.CaseResult) int {
	n := 0
	for _, s := range c.Steps {
		n += len(s.Mismatches)
	}
	return n
}
