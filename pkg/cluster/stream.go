package cluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"runtime"
	"strconv"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Reading a stream of documents: a splitter reads the input once, as a
// stream, and cuts it into units (a document, or one item of a `kind:
// List`); workers decode the units (on every CPU); a committer adds what
// they found to the snapshot in the order of the input, so that the
// snapshot and the report are what a single pass makes.
//
// Documents are delimited as utilyaml.YAMLReader delimits them (lines
// that begin with "---"), and numbered the same way. A document that
// begins with "{" is read as JSON; several JSON objects one after the
// other are one document each. The items of a List, in YAML as `kubectl
// get -o yaml` prints it (a top-level "items:" block sequence) or in
// JSON, are cut one by one and never held as a whole: an error in one
// names its item, and the others load. Since kubectl prints the kind
// after the items, whether they were a List's is known at its end: they
// are added as they come, and taken out again if it was none.
//
// Each unit is decoded once, JSON as it is, plain YAML converted to JSON
// by yamlToJSON (without the YAML parser's maps and re-encoding), both
// strictly into the typed structs. Only when that finds anything to
// report (or yamlToJSON cannot convert) is the unit decoded again as the
// YAML path always did: yaml.YAMLToJSONStrict, then the same decoding; so
// every error, note and unknown field is in its words and order.

// parallelMin is the size of an in-memory input from which decoding runs
// on every CPU; smaller ones are decoded on the caller's goroutine.
var parallelMin = 256 << 10

// addStream reads r to its end (see the comment above), adding what it
// holds to s and report. readErr words an error reading r.
func (s *Snapshot) addStream(r io.Reader, file string, replace bool, report *Report, readErr func(error) error) {
	sp := &splitter{in: newInput(r), file: file, readErr: readErr}
	c := &committer{s: s, replace: replace, report: report}
	workers := runtime.GOMAXPROCS(0)
	if br, ok := r.(*bytes.Reader); ok && br.Len() < parallelMin || workers < 2 {
		sp.emit = func(t *task) {
			if t.u != nil {
				t.run()
			}
			c.handle(t)
		}
		sp.run()
		return
	}
	ordered := make(chan *task, 8*workers)
	work := make(chan *task, 8*workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for t := range work {
				t.run()
				close(t.done)
			}
		})
	}
	sp.emit = func(t *task) {
		if t.u != nil {
			t.done = make(chan struct{})
		}
		ordered <- t
		if t.u != nil {
			work <- t
		}
	}
	go func() {
		sp.run()
		close(ordered)
		close(work)
	}()
	for t := range ordered {
		if t.u != nil {
			<-t.done
			t.done = nil
		}
		c.handle(t)
	}
	wg.Wait()
}

// A task is what the splitter hands on, in the order of the input: a unit
// to decode, or news of the document (an error, the end of a List).
type task struct {
	u    *unit
	done chan struct{} // closed when u is decoded (parallel)
	res  []result
	list bool // u was a List (of items inline, or streamed before it)

	item  bool  // u is an item of a List being streamed, still to be confirmed by its end
	end   bool  // u is the rest of a List whose items were streamed
	abort bool  // the document being read is dropped (with its List's items)
	err   error // to report (after dropping the List)
}

// A unit is one document, or one item of a List, to decode.
type unit struct {
	src  Source
	item string // the List item it is, "" for a document
	base int    // how many items of the List came before those inline in data
	data []byte
	// data[json:jsonEnd] is JSON as read: it is decoded as it is, and
	// data parsed as YAML only if that finds anything to report. json < 0:
	// data is YAML.
	json, jsonEnd int
	// compact, when set, is data[json:jsonEnd] without the white space
	// between its tokens (kubectl indents its JSON): decoded instead.
	compact []byte
	seq     bool        // data is a YAML sequence of one element, the item
	lines   []lineShift // where data's lines are in the document
}

// lineShift: data's lines from line on (0-based) are in the document from
// docLine on.
type lineShift struct{ line, docLine int }

// buffers hold the text of units (and the JSON of YAML units) while they
// are decoded: the decoder copies what it keeps.
var buffers = sync.Pool{New: func() any { return new([]byte) }}

func getBuffer() []byte { return (*buffers.Get().(*[]byte))[:0] }

func putBuffer(b []byte) {
	if cap(b) > 0 && cap(b) <= 64<<10 {
		b = b[:0]
		buffers.Put(&b)
	}
}

// run decodes the unit: JSON as it is, YAML converted by yamlToJSON; and
// when that finds anything to report (or cannot convert), as the YAML path
// always did (yaml.YAMLToJSONStrict, then the same decoding), so that
// what is reported is in its words.
func (t *task) run() {
	t.decode()
	putBuffer(t.u.data)
	putBuffer(t.u.compact)
	t.u.data, t.u.compact = nil, nil
}

func (t *task) decode() {
	u := t.u
	quick := func(j []byte, mode int) bool {
		res, list := analyze(j, u.src, u.item, u.base, mode, nil)
		for i := range res {
			if !res[i].clean() {
				return false
			}
		}
		t.res, t.list = res, list
		return true
	}
	if u.json >= 0 {
		raw := u.data[u.json:u.jsonEnd]
		if u.compact != nil {
			raw = u.compact
		}
		if jsonClean(raw) && quick(raw, decodeUnique) {
			return
		}
	} else {
		buf := getBuffer()
		j, ok := yamlToJSON(u.data, buf)
		done := ok && quick(u.element(j), decodeValid)
		if ok {
			buf = j
		}
		putBuffer(buf)
		if done {
			return
		}
	}
	j, err := yaml.YAMLToJSONStrict(u.data) // duplicate keys are errors, not "last wins"
	if err != nil {
		t.res = []result{{err: fmt.Errorf("%s: invalid YAML: %w", where(u.src, u.item), u.docLines(err))}}
		return
	}
	t.res, t.list = analyze(u.element(j), u.src, u.item, u.base, decodeChecked, nil)
}

// element is the item of a unit that is a sequence of one (u.seq), else j.
func (u *unit) element(j []byte) []byte {
	if u.seq {
		if j = bytes.TrimSpace(j); len(j) >= 2 && j[0] == '[' && j[len(j)-1] == ']' {
			j = j[1 : len(j)-1]
		}
	}
	return j
}

var lineNumber = regexp.MustCompile(`\bline ([0-9]+)`)

// docLines rewrites the line numbers of a YAML error about u's data into
// lines of the document.
func (u *unit) docLines(err error) error {
	if len(u.lines) == 0 || len(u.lines) == 1 && u.lines[0] == (lineShift{}) {
		return err
	}
	msg := lineNumber.ReplaceAllStringFunc(err.Error(), func(m string) string {
		n, _ := strconv.Atoi(m[len("line "):])
		var sh lineShift
		for _, s := range u.lines {
			if s.line <= n-1 {
				sh = s
			}
		}
		return "line " + strconv.Itoa(n+sh.docLine-sh.line)
	})
	return errors.New(msg)
}

// committer adds the decoded units to the snapshot, in order. The items
// of a List whose end is still to come are added as they come, and taken
// out again if the end says the document was no List (or was dropped):
// without replace, adding only appends, so that undoing it is exact.
// With replace (which may delete what was there), they wait.
type committer struct {
	s       *Snapshot
	replace bool
	report  *Report
	pending [][]result // with replace: the items of the List being read
	undo    *undoList  // without: how to take them out
}

// undoList is the snapshot and report as they were before a List's items.
type undoList struct {
	lens                   [11]int
	objects, errors, notes int
	skipped                map[string]int
}

func (c *committer) handle(t *task) {
	commit := func(res []result) {
		for i := range res {
			c.s.commit(&res[i], c.replace, c.report)
		}
	}
	switch {
	case t.abort:
		c.dropItems()
	case t.item && c.replace:
		c.pending = append(c.pending, t.res)
	case t.item:
		if c.undo == nil {
			r := c.report
			c.undo = &undoList{lens: c.s.lens(), objects: r.Objects, errors: len(r.Errors), notes: len(r.Notes), skipped: maps.Clone(r.Skipped)}
		}
		commit(t.res)
	case t.end:
		if t.list {
			for _, res := range c.pending {
				commit(res)
			}
			c.pending, c.undo = nil, nil
		} else {
			c.dropItems()
		}
		commit(t.res)
	case t.u != nil:
		commit(t.res)
	}
	if t.err != nil {
		c.report.Errors = append(c.report.Errors, t.err)
	}
}

// dropItems takes out the items of a List that was none.
func (c *committer) dropItems() {
	c.pending = nil
	if u := c.undo; u != nil {
		c.s.truncate(u.lens)
		r := c.report
		r.Objects, r.Errors, r.Notes, r.Skipped = u.objects, r.Errors[:u.errors], r.Notes[:u.notes], u.skipped
		c.undo = nil
	}
}

// lens are the lengths of the snapshot's lists of objects.
func (s *Snapshot) lens() [11]int {
	return [11]int{len(s.Namespaces), len(s.Nodes), len(s.Pods), len(s.Services), len(s.EndpointSlices),
		len(s.NetworkPolicies), len(s.AdminPolicies), len(s.BaselinePolicies), len(s.ClusterPolicies), len(s.ConfigMaps),
		len(s.ServiceCIDRs)}
}

// truncate takes out the objects added after lens (by appending), with
// their origins and unknown fields.
func (s *Snapshot) truncate(lens [11]int) {
	forget := func(kind string, o metav1.Object) {
		key := ObjectKey{Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName()}
		delete(s.Origin, key)
		delete(s.UnknownFields, key)
	}
	s.Namespaces = cut(s.Namespaces, lens[0], KindNamespace, forget)
	s.Nodes = cut(s.Nodes, lens[1], KindNode, forget)
	s.Pods = cut(s.Pods, lens[2], KindPod, forget)
	s.Services = cut(s.Services, lens[3], KindService, forget)
	s.EndpointSlices = cut(s.EndpointSlices, lens[4], KindEndpointSlice, forget)
	s.NetworkPolicies = cut(s.NetworkPolicies, lens[5], KindNetworkPolicy, forget)
	s.AdminPolicies = cut(s.AdminPolicies, lens[6], KindAdminPolicy, forget)
	s.BaselinePolicies = cut(s.BaselinePolicies, lens[7], KindBaselinePolicy, forget)
	s.ClusterPolicies = cut(s.ClusterPolicies, lens[8], KindClusterPolicy, forget)
	s.ConfigMaps = cut(s.ConfigMaps, lens[9], KindConfigMap, forget)
	s.ServiceCIDRs = cut(s.ServiceCIDRs, lens[10], KindServiceCIDR, forget)
}

func cut[T metav1.Object](list []T, n int, kind string, forget func(string, metav1.Object)) []T {
	for _, o := range list[n:] {
		forget(kind, o)
	}
	clear(list[n:])
	if n == 0 {
		return nil // as before
	}
	return list[:n]
}

// input reads the stream: it counts lines and can record what it consumes.
type input struct {
	br    *bufio.Reader
	eof   bool
	err   error // the read error that ended the input, other than io.EOF
	lines int   // line breaks consumed
	bol   bool  // at the beginning of a line
	rec   []byte
	recOn bool // consumed bytes are appended to rec
	why   string
}

func newInput(r io.Reader) *input {
	return &input{br: bufio.NewReaderSize(r, 256<<10), bol: true}
}

// window is what can be read without waiting: empty at the end.
func (in *input) window() []byte {
	if in.br.Buffered() == 0 {
		if in.eof {
			return nil
		}
		if _, err := in.br.Peek(1); err != nil {
			in.end(err)
			return nil
		}
	}
	b, _ := in.br.Peek(in.br.Buffered())
	return b
}

func (in *input) end(err error) {
	in.eof = true
	if err != io.EOF && in.err == nil {
		in.err = err
	}
}

// advance consumes w[:n] (w a window).
func (in *input) advance(w []byte, n int) {
	if n == 0 {
		return
	}
	in.lines += bytes.Count(w[:n], newline)
	in.bol = w[n-1] == '\n'
	if in.recOn {
		in.rec = append(in.rec, w[:n]...)
	}
	in.br.Discard(n)
}

var newline = []byte{'\n'}

// Kinds of line, as nextLine sees them.
const (
	lineEOF   = iota
	lineSep   // begins with "---"
	lineBlank // nothing, spaces, or spaces and a comment
	lineJSON  // spaces, then "{"
	lineOther
)

// nextLine says what the next line is, without consuming it (at the
// beginning of a line).
func (in *input) nextLine() int {
	size := in.br.Size()
	for n := 64; ; n *= 2 {
		n = min(n, size)
		b, err := in.br.Peek(n)
		if len(b) == 0 {
			in.end(err)
			return lineEOF
		}
		if bytes.HasPrefix(b, []byte("---")) {
			return lineSep
		}
		i := 0
		for i < len(b) && b[i] == ' ' {
			i++
		}
		if i < len(b) {
			switch b[i] {
			case '\n', '#':
				return lineBlank
			case '\r':
				if i+1 < len(b) && b[i+1] == '\n' {
					return lineBlank
				}
				if i+1 == len(b) && err == nil && n < size {
					continue // is it "\r\n"?
				}
				return lineOther
			case '{':
				return lineJSON
			}
			return lineOther
		}
		if err != nil {
			return lineBlank // spaces, then the end
		}
		if n == size {
			return lineOther
		}
	}
}

// readLine appends the next line to dst, as utilyaml.LineReader reads it
// (its "\n" or "\r\n" made "\n", and a "\n" added to a last line that has
// none); false at the end of the input.
func (in *input) readLine(dst []byte) ([]byte, bool) {
	start := len(dst)
	got := false
	for {
		w := in.window()
		if len(w) == 0 {
			break
		}
		got = true
		if i := bytes.IndexByte(w, '\n'); i >= 0 {
			dst = append(dst, w[:i]...)
			in.advance(w, i+1)
			if len(dst) > start && dst[len(dst)-1] == '\r' {
				dst = dst[:len(dst)-1]
			}
			return append(dst, '\n'), true
		}
		dst = append(dst, w...)
		in.advance(w, len(w))
	}
	if !got {
		return dst, false
	}
	return append(dst, '\n'), true
}

// sepAhead: the line that begins here begins with "---".
func (in *input) sepAhead() bool {
	b, _ := in.br.Peek(3)
	return string(b) == "---"
}

// separatorError is utilyaml.YAMLReader's for a "---" line with more on it
// than a comment.
func separatorError(line []byte) error {
	rest := bytes.TrimSpace(line[3:])
	if len(rest) > 0 && rest[0] != '#' {
		return fmt.Errorf("invalid Yaml document separator: %s", rest)
	}
	return nil
}

// splitter cuts the input into units (see the comment at the top).
type splitter struct {
	in      *input
	file    string
	readErr func(error) error
	emit    func(*task)
	doc     int  // the number of the last document begun
	json    bool // the next document begins with the "{" ahead (JSON objects one after the other)
	stop    bool
	line    []byte // scratch
}

func (sp *splitter) run() {
	for !sp.stop && sp.document() {
	}
}

// document reads the next document; false at the end of the input.
func (sp *splitter) document() bool {
	in := sp.in
	begun := false
	first := in.lines
	begin := func() {
		if !begun {
			begun = true
			sp.doc++
		}
	}
	if sp.json {
		sp.json = false
		begin()
		sp.jsonDocument(nil, first)
		return true
	}
	lead := getBuffer() // blank and comment lines before the document's content
	for {
		switch in.nextLine() {
		case lineEOF:
			if in.err != nil {
				sp.fail(nil)
			}
			return false
		case lineSep:
			if !sp.separator(begun) {
				return false
			}
			if begun {
				return true // a document of blank lines and comments
			}
			first = in.lines
		case lineBlank:
			begin()
			lead, _ = in.readLine(lead)
		case lineJSON:
			begin()
			sp.jsonDocument(lead, first)
			return true
		default:
			begin()
			sp.yamlDocument(lead, first)
			return true
		}
	}
}

// separator consumes a "---" line; false (and the input stops) if it is
// not a separator. begun: the current document was begun (the error is
// its own, as utilyaml.YAMLReader reports it; it is not read).
func (sp *splitter) separator(begun bool) bool {
	line, _ := sp.in.readLine(sp.line[:0])
	sp.line = line
	if err := separatorError(line); err != nil {
		n := sp.doc
		if !begun {
			n++
		}
		sp.emit(&task{abort: true, err: fmt.Errorf("%s (document %d): %w", sp.file, n, err)})
		sp.stop = true
		return false
	}
	return true
}

// finish ends the current document at a separator or the end of the
// input; false if it is to be dropped (a bad separator, a read error),
// which it has reported.
func (sp *splitter) finish() bool {
	switch sp.in.nextLine() {
	case lineSep:
		return sp.separator(true)
	case lineEOF:
		if sp.in.err != nil {
			sp.fail(nil)
			return false
		}
	}
	return true
}

// fail drops the current document (err its error, if any) and, on a read
// error, stops.
func (sp *splitter) fail(err error) {
	if sp.in.err != nil {
		err = sp.readErr(sp.in.err)
		sp.stop = true
	}
	sp.emit(&task{abort: true, err: err})
}

func (sp *splitter) src() Source { return Source{File: sp.file, Document: sp.doc} }

func countLines(b []byte) int { return bytes.Count(b, newline) }

// yamlDocument reads a YAML document, its lead read. A top-level "items:"
// block sequence is cut into its items (one unit each), the rest of the
// document (with "items: []" in their place) is the List's end.
func (sp *splitter) yamlDocument(lead []byte, first int) {
	in := sp.in
	const (
		head = iota
		itemsKey
		items
		rest
	)
	var (
		lx      yamlLexer
		text    = lead // the document, but the streamed items
		shifts  []lineShift
		tl      = countLines(lead) // lines in text
		dl      = tl               // lines of the document read
		root    int                // 1: the document is a block mapping; -1: it is not
		st      = head
		held    []byte // "items:" and the blank lines after it
		heldN   int
		itemsAt int // where "items:" is in text
		c       int // the items' indentation
		cur     []byte
		curAt   int // the document line cur begins on
		n       int // items begun
		tail    bool
	)
	emitItem := func() {
		if cur != nil && !tail {
			sp.emit(&task{item: true, u: &unit{src: sp.src(), item: strconv.Itoa(n), data: cur, json: -1, seq: true,
				lines: []lineShift{{0, curAt}}}})
		}
		cur = nil
	}
	// toTail puts the current item, and all that follows, in text: an
	// anchor or alias may tie them together.
	toTail := func() {
		tail = true
		text = append(text[:itemsAt], "items:\n"...)
		shifts = append(shifts, lineShift{tl, curAt})
		text = append(text, cur...)
		tl += countLines(cur)
		putBuffer(cur)
		cur = nil
	}
	for {
		k := in.nextLine()
		if k == lineEOF || k == lineSep {
			break
		}
		line, _ := in.readLine(sp.line[:0])
		sp.line = line
		l := lx.line(line[:len(line)-1])
		switch st {
		case head:
			if root == 0 && !l.blank && !l.cont {
				root = -1
				if l.key != nil && l.indent == 0 && !l.dash {
					root = 1
				}
			}
			if root == 1 && n == 0 && heldN == 0 && !l.cont && l.indent == 0 && l.empty && string(l.key) == "items" && !lx.anchors {
				st, held, heldN = itemsKey, append(held[:0], line...), 1
				break
			}
			text = append(text, line...)
			tl++
		case itemsKey:
			if l.blank {
				held = append(held, line...)
				heldN++
				break
			}
			if !l.cont && l.dash {
				st, c, n = items, l.indent, 1
				shifts = append(shifts, lineShift{tl, dl - heldN})
				itemsAt = len(text)
				text = append(text, "items: []\n"...)
				tl++
				cur, curAt = append(getBuffer(), line...), dl
				if l.anchor {
					toTail()
				}
				break
			}
			// Not a sequence: "items:" stays as it is.
			st = head
			text = append(append(text, held...), line...)
			tl += heldN + 1
		case items:
			switch {
			case tail:
				text = append(text, line...)
				tl++
			case l.blank || l.cont || l.indent > c:
				cur = append(cur, line...)
				if l.anchor {
					toTail()
				}
			case l.indent == c && l.dash:
				emitItem()
				n++
				cur, curAt = append(getBuffer(), line...), dl
				if l.anchor {
					toTail()
				}
			default:
				emitItem()
				st = rest
				if !tail {
					shifts = append(shifts, lineShift{tl, dl})
				}
				text = append(text, line...)
				tl++
			}
		case rest:
			text = append(text, line...)
			tl++
		}
		dl++
	}
	switch st {
	case itemsKey:
		text = append(text, held...)
	case items:
		emitItem()
	}
	if !sp.finish() {
		return
	}
	u := &unit{src: sp.src(), data: text, json: -1}
	if n == 0 {
		sp.emit(&task{u: u})
		return
	}
	u.lines = append([]lineShift{{0, 0}}, shifts...)
	if tail {
		u.base = n - 1
	}
	sp.emit(&task{u: u, end: true})
}

// jsonDocument reads a document that begins with "{" (after lead): one
// JSON object, whose "items" array, if it has one, is cut into its items.
// What does not read as JSON before an item is cut is read as YAML.
func (sp *splitter) jsonDocument(lead []byte, first int) {
	in := sp.in
	in.rec, in.recOn = lead, true
	in.skipBlanks()
	at := len(in.rec)
	in.why = ""
	var (
		streamed bool
		n        int
		shifts   []lineShift
		bad      bool
	)
	failItem := 0 // the item being read when the input failed
	items := func() bool {
		text := in.rec
		defer func() { in.rec, in.recOn = text, true }()
		in.recOn = false
		for n = 0; ; {
			failItem = n + 1
			c, ok := in.skipSpace()
			if !ok {
				return false
			}
			if c == ']' {
				in.take(1)
				return true
			}
			if n > 0 {
				if c != ',' {
					return in.unexpected(c)
				}
				in.take(1)
				if c, ok = in.skipSpace(); !ok {
					return false
				}
				if c == ']' {
					in.take(1)
					return true
				}
			}
			n++
			line := in.lines - first
			in.rec, in.recOn = getBuffer(), true
			ok = in.readValue()
			in.recOn = false
			if !ok {
				return false
			}
			u := &unit{src: sp.src(), item: strconv.Itoa(n), data: in.rec, jsonEnd: len(in.rec), lines: []lineShift{{0, line}}}
			if bytes.IndexByte(in.rec, '\n') >= 0 {
				buf := getBuffer()
				if c, ok := compactJSON(buf, in.rec); ok {
					u.compact = c
				} else {
					putBuffer(buf)
				}
			}
			sp.emit(&task{item: true, u: u})
		}
	}
	in.take(1) // "{"
	for members := 0; ; members++ {
		c, ok := in.skipSpace()
		if ok && members > 0 && c == ',' {
			in.take(1)
			c, ok = in.skipSpace()
		} else if ok && members > 0 && c != '}' {
			ok = in.unexpected(c)
		}
		if !ok {
			bad = true
			break
		}
		if c == '}' {
			in.take(1)
			break
		}
		key := len(in.rec)
		if c != '"' || !in.readString() {
			bad = true
			break
		}
		isItems := jsonKeyIs(in.rec[key:], "items")
		if c, ok = in.skipSpace(); !ok || c != ':' {
			bad = true
			break
		}
		in.take(1)
		if c, ok = in.skipSpace(); !ok {
			bad = true
			break
		}
		if isItems && c == '[' && !streamed {
			streamed = true
			in.take(1)
			if !items() {
				bad = true
				break
			}
			failItem = 0
			in.rec = append(in.rec, ']')
			shifts = append(shifts, lineShift{countLines(in.rec), in.lines - first})
			continue
		}
		if !in.readValue() {
			bad = true
			break
		}
	}
	end := len(in.rec)
	var next int
	if !bad {
		next = in.afterJSON()
		bad = next == afterOther
	}
	if bad && !streamed {
		// Not JSON: read the document as YAML (and as the YAML path would).
		in.recOn = false
		text := in.rec
		if !in.bol {
			text, _ = in.readLine(text)
		}
		for k := in.nextLine(); k != lineEOF && k != lineSep; k = in.nextLine() {
			text, _ = in.readLine(text)
		}
		in.rec = nil
		if sp.finish() {
			sp.emit(&task{u: &unit{src: sp.src(), data: text, json: -1}})
		}
		return
	}
	in.recOn = false
	text := in.rec
	in.rec = nil
	if bad {
		why := in.why
		if why == "" {
			why = "more than one object" // only spaces and comments may follow it
		}
		at := Source{File: sp.file, Document: sp.doc}.String()
		if failItem > 0 {
			at = where(sp.src(), strconv.Itoa(failItem))
		}
		err := fmt.Errorf("%s: invalid JSON at line %d: %s", at, in.lines-first+1, why)
		// Skip to the next document.
		if !in.bol {
			in.readLine(nil)
		}
		for k := in.nextLine(); k != lineEOF && k != lineSep; k = in.nextLine() {
			in.readLine(nil)
		}
		if sp.finish() {
			sp.emit(&task{abort: true, err: err})
		}
		return
	}
	u := &unit{src: sp.src(), data: text, json: at, jsonEnd: end}
	if streamed {
		u.lines = append([]lineShift{{0, 0}}, shifts...)
	}
	switch next {
	case afterNext:
		sp.json = true
	case afterEnd:
		if !sp.finish() {
			return
		}
	}
	sp.emit(&task{u: u, end: streamed})
}

// What follows a JSON object.
const (
	afterEnd   = iota // a separator or the end of the input
	afterNext         // another object
	afterOther        // anything else
)

// afterJSON consumes the spaces, comments and blank lines after a JSON
// object and says what comes next.
func (in *input) afterJSON() int {
	for {
		if in.bol {
			switch in.nextLine() {
			case lineEOF, lineSep:
				return afterEnd
			case lineBlank:
				in.readLine(nil)
				continue
			case lineJSON:
				in.skipBlanks()
				return afterNext
			}
			return afterOther
		}
		w := in.window()
		if len(w) == 0 {
			return afterEnd
		}
		i := 0
		for i < len(w) && (w[i] == ' ' || w[i] == '\t') {
			i++
		}
		if i == len(w) {
			in.advance(w, i)
			continue
		}
		switch w[i] {
		case '\n':
			in.advance(w, i+1)
			continue
		case '\r':
			if i+1 < len(w) && w[i+1] == '\n' {
				in.advance(w, i+2)
				continue
			}
		case '#':
			if i > 0 {
				in.advance(w, i)
				in.readLine(nil)
				continue
			}
		case '{':
			in.advance(w, i)
			return afterNext
		}
		in.advance(w, i)
		return afterOther
	}
}

// skipBlanks consumes spaces.
func (in *input) skipBlanks() {
	for {
		w := in.window()
		i := 0
		for i < len(w) && w[i] == ' ' {
			i++
		}
		in.advance(w, i)
		if i < len(w) || len(w) == 0 {
			return
		}
	}
}

// take consumes n bytes of the window (that it holds).
func (in *input) take(n int) { in.advance(in.window(), n) }

func (in *input) unexpected(c byte) bool {
	in.why = fmt.Sprintf("unexpected %q", c)
	return false
}

// skipSpace consumes JSON's white space and YAML comments, and returns the
// next byte; false at the end of the input or at a line that begins with
// "---".
func (in *input) skipSpace() (byte, bool) {
	space := in.bol // what came before is white space
	for {
		if in.bol && in.sepAhead() {
			in.why = "a document separator (---) inside the object"
			return 0, false
		}
		w := in.window()
		if len(w) == 0 {
			in.why = "unexpected end of input"
			return 0, false
		}
		i := 0
		for i < len(w) {
			c := w[i]
			switch c {
			case ' ', '\t', '\r':
				i++
				space = true
				continue
			case '\n':
				in.advance(w, i+1)
				space = true
				goto next
			case '#':
				if space {
					in.advance(w, i)
					in.readLine(nil)
					space = true
					goto next
				}
			}
			in.advance(w, i)
			return c, true
		}
		in.advance(w, i)
	next:
	}
}

// readString consumes a JSON string (its opening quote ahead).
func (in *input) readString() bool {
	in.take(1)
	esc := false
	for {
		w := in.window()
		if len(w) == 0 {
			in.why = "unexpected end of input"
			return false
		}
		for i := 0; i < len(w); i++ {
			if esc {
				esc = false
				continue
			}
			j := bytes.IndexAny(w[i:], "\"\\\n")
			if j < 0 {
				break
			}
			i += j
			switch w[i] {
			case '\\':
				esc = true
			case '"':
				in.advance(w, i+1)
				return true
			case '\n':
				in.advance(w, i)
				in.why = "a line break in a string"
				return false
			}
		}
		if esc {
			// The escaped byte is in the next window.
			in.advance(w, len(w)-1)
			esc = false
			b, _ := in.br.Peek(2)
			if len(b) < 2 {
				in.why = "unexpected end of input"
				return false
			}
			in.advance(b, 2)
			continue
		}
		in.advance(w, len(w))
	}
}

// readValue consumes one JSON value, checked for no more than its
// strings and brackets (the decoder checks the rest); false if the input
// ends first, a string holds a line break, brackets do not match, or a
// line begins with "---".
func (in *input) readValue() bool {
	w := in.window()
	if len(w) == 0 {
		in.why = "unexpected end of input"
		return false
	}
	switch w[0] {
	case '"':
		return in.readString()
	case '{', '[':
	default:
		// A number, true, false or null (or not JSON).
		for {
			i := bytes.IndexAny(w, ",]}\n\r\t #")
			if i >= 0 {
				in.advance(w, i)
				return true
			}
			in.advance(w, len(w))
			if w = in.window(); len(w) == 0 {
				return true
			}
		}
	}
	var closers []byte
	for {
		if in.bol && in.sepAhead() {
			in.why = "a document separator (---) inside the object"
			return false
		}
		w := in.window()
		if len(w) == 0 {
			in.why = "unexpected end of input"
			return false
		}
		i := 0
		for i < len(w) {
			for i < len(w) && !jsonStructure[w[i]] {
				i++
			}
			if i == len(w) {
				break
			}
			switch c := w[i]; c {
			case '{':
				closers = append(closers, '}')
			case '[':
				closers = append(closers, ']')
			case '}', ']':
				if len(closers) == 0 || closers[len(closers)-1] != c {
					in.advance(w, i)
					return in.unexpected(c)
				}
				closers = closers[:len(closers)-1]
				if len(closers) == 0 {
					in.advance(w, i+1)
					return true
				}
			case '"':
				end := stringEnd(w, i+1)
				if end < 0 { // it goes on past the window, or has a line break
					in.advance(w, i)
					if !in.readString() {
						return false
					}
					goto next
				}
				i = end
				continue
			case '\n':
				in.advance(w, i+1)
				goto next
			}
			i++
		}
		in.advance(w, i)
	next:
	}
}

// jsonStructure are the bytes readValue stops at.
var jsonStructure = [256]bool{'{': true, '}': true, '[': true, ']': true, '"': true, '\n': true}

// stringEnd returns the index after the quote that ends the JSON string
// whose text begins at i, or -1 if w ends first or the string has a line
// break.
func stringEnd(w []byte, i int) int {
	for j := i; ; {
		k := bytes.IndexByte(w[j:], '"')
		if k < 0 {
			return -1
		}
		q := j + k
		if bytes.IndexByte(w[j:q], '\n') >= 0 {
			return -1
		}
		bs := 0
		for q-1-bs >= i && w[q-1-bs] == '\\' {
			bs++
		}
		if bs%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

// jsonKeyIs: the JSON string key (quoted) is name.
func jsonKeyIs(key []byte, name string) bool {
	if len(key) == len(name)+2 && string(key[1:len(key)-1]) == name {
		return true
	}
	if !bytes.ContainsRune(key, '\\') {
		return false
	}
	s, err := strconv.Unquote(string(key))
	return err == nil && s == name
}
