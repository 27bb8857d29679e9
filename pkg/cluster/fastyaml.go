package cluster

import (
	"bytes"
	"regexp"
	"strconv"
	"sync"
	"unicode/utf8"
)

// yamlToJSON converts one YAML document to JSON as yaml.YAMLToJSONStrict
// does (but for the order of keys), for the plain block YAML that kubectl
// and most tools write: block mappings and sequences, flow collections on
// one line, plain and quoted scalars on one line, literal block scalars,
// comments. For anything else (anchors, tags, multi-line flow and plain
// scalars, folded scalars, floats, timestamps, duplicate keys, non-string
// keys, tabs, ...) it says no, and the caller leaves the document to the
// YAML parser: the parser reads about 10 MB/s into maps, this 100 MB/s
// into the JSON the decoder reads next. d ends with a line break (as the
// splitter cuts it).
func yamlToJSON(d, out []byte) (j []byte, ok bool) {
	if !yamlPlain(d) {
		return nil, false
	}
	p := fastYAMLs.Get().(*fastYAML)
	p.d, p.pos, p.virt, p.out = d, 0, false, out[:0]
	defer func() {
		r := recover()
		p.d, p.out = nil, nil
		clear(p.keys[:cap(p.keys)])
		clear(p.sets[:cap(p.sets)])
		p.keys, p.sets, p.frameStarts, p.frameSetsBeforeStart = p.keys[:0], p.sets[:0], p.frameStarts[:0], p.frameSetsBeforeStart[:0]
		fastYAMLs.Put(p)
		if r != nil {
			if r != errNotPlain {
				panic(r)
			}
			j, ok = nil, false
		}
	}()
	l, found := p.peek()
	if !found {
		return append(p.out, "null"...), true
	}
	p.block(l.indent)
	if _, more := p.peek(); more {
		p.fail()
	}
	return p.out, true
}

var fastYAMLs = sync.Pool{New: func() any { return new(fastYAML) }}

type notPlain struct{}

var errNotPlain any = notPlain{}

// yamlPlain: d is printable as YAML reads it (valid UTF-8, no control
// characters), has no line break but "\n", and ends with one.
func yamlPlain(d []byte) bool {
	if len(d) == 0 || d[len(d)-1] != '\n' {
		return len(d) == 0
	}
	for i := 0; i < len(d); {
		c := d[i]
		if c < utf8.RuneSelf {
			if c < 0x20 && c != '\t' && c != '\n' || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(d[i:])
		if r == utf8.RuneError && size == 1 || !(r >= 0xa0 && r <= 0xd7ff && r != 0x2028 && r != 0x2029 || r >= 0xe000 && r <= 0xfffd && r != 0xfeff || r >= 0x10000) {
			return false
		}
		i += size
	}
	return true
}

type fastYAML struct {
	d   []byte
	pos int // the beginning of the next line
	// A sequence entry's mapping begins on the entry's line: its rest, at
	// column virtCol, is the next line.
	virt                 bool
	virtStart, virtEnd   int
	virtCol              int
	out                  []byte
	keys                 [][]byte // of the mappings being read
	sets                 []map[string]bool
	scratch              []byte
	frameStarts          []int
	frameSetsBeforeStart []int
}

// fyLine is a line with content: d[start:end], after indent spaces.
type fyLine struct {
	start, end, indent, next int
}

func (p *fastYAML) fail() { panic(errNotPlain) }

// peek returns the next line with content (not blank, not a comment).
func (p *fastYAML) peek() (fyLine, bool) {
	if p.virt {
		return fyLine{start: p.virtStart, end: p.virtEnd, indent: p.virtCol, next: p.pos}, true
	}
	d := p.d
	for pos := p.pos; pos < len(d); {
		end := pos + bytes.IndexByte(d[pos:], '\n') // d ends with "\n"
		i := pos
		for i < end && d[i] == ' ' {
			i++
		}
		if i < end && d[i] == '\t' {
			p.fail()
		}
		if i == end || d[i] == '#' {
			pos = end + 1
			continue
		}
		if i == pos && (d[i] == '%' || bytes.HasPrefix(d[i:end], []byte("---")) || bytes.HasPrefix(d[i:end], []byte("..."))) {
			p.fail()
		}
		next := end + 1
		for end > i && d[end-1] == ' ' {
			end--
		}
		return fyLine{start: i, end: end, indent: i - pos, next: next}, true
	}
	return fyLine{}, false
}

func (p *fastYAML) consume(l fyLine) {
	if p.virt {
		p.virt = false
		return
	}
	p.pos = l.next
}

func (p *fastYAML) isDash(l fyLine) bool {
	if p.d[l.start] != '-' {
		return false
	}
	if l.start+1 == l.end || p.d[l.start+1] == ' ' {
		return true
	}
	if p.d[l.start+1] == '\t' {
		p.fail()
	}
	return false
}

// block reads the mapping or sequence whose first line is next.
func (p *fastYAML) block(indent int) {
	l, _ := p.peek()
	if p.isDash(l) {
		p.seq(indent)
		return
	}
	p.mapping(indent)
}

func (p *fastYAML) mapping(indent int) {
	p.out = append(p.out, '{')
	p.pushKeys()
	for n := 0; ; n++ {
		l, ok := p.peek()
		if !ok || l.indent < indent {
			break
		}
		if l.indent > indent || p.isDash(l) {
			p.fail()
		}
		p.consume(l)
		key, pos := p.key(l.start, l.end)
		p.addKey(key)
		if n > 0 {
			p.out = append(p.out, ',')
		}
		p.out = appendJSONString(p.out, key)
		p.out = append(p.out, ':')
		p.value(pos, l.end, indent, true)
	}
	p.popKeys()
	p.out = append(p.out, '}')
}

func (p *fastYAML) seq(indent int) {
	d := p.d
	p.out = append(p.out, '[')
	for n := 0; ; n++ {
		l, ok := p.peek()
		if !ok || l.indent < indent {
			break
		}
		if l.indent > indent {
			p.fail()
		}
		if !p.isDash(l) {
			break // the mapping this sequence is a value of goes on
		}
		p.consume(l)
		if n > 0 {
			p.out = append(p.out, ',')
		}
		from := l.start + 1
		for from < l.end && d[from] == ' ' {
			from++
		}
		switch {
		case from == l.end || d[from] == '#':
			p.below(indent, false)
		case d[from] == '\t' || d[from] == '-' && (from+1 == l.end || d[from+1] == ' '):
			p.fail()
		case p.isKey(from, l.end):
			p.virt, p.virtStart, p.virtEnd, p.virtCol = true, from, l.end, l.indent+from-l.start
			p.mapping(p.virtCol)
		default:
			p.inline(from, l.end, indent)
		}
	}
	p.out = append(p.out, ']')
}

// value reads what follows a key's ":" (at pos, on a line ending at end).
func (p *fastYAML) value(pos, end, indent int, mapping bool) {
	d := p.d
	for pos < end && d[pos] == ' ' {
		pos++
	}
	if pos < end && d[pos] == '\t' {
		p.fail()
	}
	if pos == end || d[pos] == '#' {
		p.below(indent, mapping)
		return
	}
	p.inline(pos, end, indent)
}

// below reads a node on the lines that follow (null if there is none).
func (p *fastYAML) below(indent int, seqAtIndent bool) {
	l, ok := p.peek()
	switch {
	case ok && l.indent > indent:
		p.block(l.indent)
	case ok && seqAtIndent && l.indent == indent && p.isDash(l):
		p.seq(indent)
	default:
		p.out = append(p.out, "null"...)
	}
}

// inline reads a node that begins at pos and ends on its line (but a
// literal block scalar).
func (p *fastYAML) inline(pos, end, indent int) {
	d := p.d
	switch c := d[pos]; c {
	case '{', '[':
		pos = p.flow(pos, end)
		p.trailer(pos, end)
	case '"', '\'':
		var s []byte
		s, pos = p.quoted(pos, end)
		p.out = appendJSONString(p.out, s)
		p.trailer(pos, end)
	case '|':
		p.literal(pos, end, indent)
	default:
		if !plainFirst(d, pos, end, false) {
			p.fail()
		}
		i := pos
		for ; i < end; i++ {
			switch d[i] {
			case ':':
				if i+1 == end || d[i+1] == ' ' {
					p.fail() // a mapping where a scalar is
				}
			case '#':
				if d[i-1] == ' ' {
					goto done
				}
			case '\t':
				p.fail()
			}
		}
	done:
		for i > pos && d[i-1] == ' ' {
			i--
		}
		p.plain(d[pos:i])
	}
}

// trailer checks that only spaces and a comment follow pos on the line.
func (p *fastYAML) trailer(pos, end int) {
	d := p.d
	start := pos
	for pos < end && d[pos] == ' ' {
		pos++
	}
	if pos < end && (d[pos] != '#' || pos == start) {
		p.fail()
	}
}

// isKey: the line from pos begins with a key (a plain or quoted scalar,
// then ":" and a space or the end of the line).
func (p *fastYAML) isKey(pos, end int) bool {
	d := p.d
	switch c := d[pos]; c {
	case '"', '\'':
		close := closeQuote(d[:end], pos+1, c)
		return close > 0 && close < end && d[close] == ':' && (close+1 == end || d[close+1] == ' ')
	case '{', '[', '|', '>', '&', '*', '!':
		return false
	}
	for i := pos; i < end; i++ {
		switch d[i] {
		case ':':
			if i+1 == end || d[i+1] == ' ' {
				return true
			}
		case '#':
			if d[i-1] == ' ' {
				return false
			}
		}
	}
	return false
}

// key reads a block mapping's key at pos: its text, and where its value
// begins (after the ":").
func (p *fastYAML) key(pos, end int) ([]byte, int) {
	d := p.d
	if c := d[pos]; c == '"' || c == '\'' {
		s, i := p.quoted(pos, end)
		if i == end || d[i] != ':' || i+1 < end && d[i+1] != ' ' {
			p.fail()
		}
		return append([]byte(nil), s...), i + 1 // not scratch: kept with the keys
	}
	if !plainFirst(d, pos, end, false) {
		p.fail()
	}
	for i := pos; i < end; i++ {
		switch d[i] {
		case ':':
			if i+1 == end || d[i+1] == ' ' {
				k := d[pos:i]
				for len(k) > 0 && k[len(k)-1] == ' ' {
					k = k[:len(k)-1]
				}
				if len(k) == 0 || resolvePlain(k) != plainString {
					p.fail()
				}
				return k, i + 1
			}
		case '#':
			if d[i-1] == ' ' {
				p.fail()
			}
		case '\t':
			p.fail()
		}
	}
	p.fail()
	return nil, 0
}

// flow reads a flow collection that ends on its line; it returns where it
// ends.
func (p *fastYAML) flow(pos, end int) int {
	d := p.d
	if d[pos] == '[' {
		p.out = append(p.out, '[')
		pos++
		for n := 0; ; n++ {
			pos = p.flowSpace(pos, end)
			if d[pos] == ']' {
				break
			}
			if n > 0 {
				if d[pos] != ',' {
					p.fail()
				}
				if pos = p.flowSpace(pos+1, end); d[pos] == ']' {
					break
				}
				p.out = append(p.out, ',')
			}
			pos = p.flowValue(pos, end)
			if pos = p.flowSpace(pos, end); d[pos] == ':' {
				p.fail() // a single pair mapping
			}
		}
		p.out = append(p.out, ']')
		return pos + 1
	}
	p.out = append(p.out, '{')
	p.pushKeys()
	pos++
	for n := 0; ; n++ {
		pos = p.flowSpace(pos, end)
		if d[pos] == '}' {
			break
		}
		if n > 0 {
			if d[pos] != ',' {
				p.fail()
			}
			if pos = p.flowSpace(pos+1, end); d[pos] == '}' {
				break
			}
			p.out = append(p.out, ',')
		}
		var key []byte
		if c := d[pos]; c == '"' || c == '\'' {
			key, pos = p.quoted(pos, end)
			key = append([]byte(nil), key...) // not scratch: kept with the keys
		} else {
			if !plainFirst(d, pos, end, true) {
				p.fail()
			}
			start := pos
			pos = p.flowPlainEnd(pos, end, true)
			key = d[start:pos]
			for len(key) > 0 && key[len(key)-1] == ' ' {
				key = key[:len(key)-1]
			}
			if len(key) == 0 || resolvePlain(key) != plainString {
				p.fail()
			}
		}
		if pos+1 >= end || d[pos] != ':' || d[pos+1] != ' ' {
			p.fail()
		}
		p.addKey(key)
		p.out = appendJSONString(p.out, key)
		p.out = append(p.out, ':')
		if pos = p.flowSpace(pos+1, end); d[pos] == ',' || d[pos] == '}' {
			p.out = append(p.out, "null"...)
			continue
		}
		pos = p.flowValue(pos, end)
	}
	p.popKeys()
	p.out = append(p.out, '}')
	return pos + 1
}

// flowSpace skips spaces in a flow collection, which must go on.
func (p *fastYAML) flowSpace(pos, end int) int {
	for pos < end && p.d[pos] == ' ' {
		pos++
	}
	if pos == end || p.d[pos] == '\t' || p.d[pos] == '#' {
		p.fail()
	}
	return pos
}

func (p *fastYAML) flowValue(pos, end int) int {
	d := p.d
	switch c := d[pos]; c {
	case '[', '{':
		return p.flow(pos, end)
	case '"', '\'':
		var s []byte
		s, pos = p.quoted(pos, end)
		p.out = appendJSONString(p.out, s)
		return pos
	}
	if !plainFirst(d, pos, end, true) {
		p.fail()
	}
	start := pos
	pos = p.flowPlainEnd(pos, end, false)
	v := d[start:pos]
	for len(v) > 0 && v[len(v)-1] == ' ' {
		v = v[:len(v)-1]
	}
	if len(v) == 0 {
		p.fail()
	}
	p.plain(v)
	return pos
}

// flowPlainEnd is the end of a plain scalar in a flow collection: at ","
// "]" "}" "[" "{", or at ":" (a key's). Anything that might read otherwise
// in YAML says no.
func (p *fastYAML) flowPlainEnd(pos, end int, key bool) int {
	d := p.d
	for ; pos < end; pos++ {
		switch d[pos] {
		case ',', ']', '}', '[', '{':
			return pos
		case ':':
			if key {
				return pos
			}
			p.fail()
		case '?', '#', '"', '\'', '\t':
			p.fail()
		}
	}
	p.fail()
	return 0
}

// quoted reads a quoted scalar that ends on its line: its text, and the
// position after it.
func (p *fastYAML) quoted(pos, end int) ([]byte, int) {
	d := p.d
	q := d[pos]
	s := p.scratch[:0]
	for i := pos + 1; i < end; i++ {
		c := d[i]
		switch {
		case c == q && q == '\'':
			if i+1 < end && d[i+1] == '\'' {
				s = append(s, '\'')
				i++
				continue
			}
			p.scratch = s
			return s, i + 1
		case c == q:
			p.scratch = s
			return s, i + 1
		case c == '\\' && q == '"':
			if i+1 == end {
				p.fail()
			}
			i++
			n := 0
			switch d[i] {
			case '0':
				s = append(s, 0)
			case 'a':
				s = append(s, '\a')
			case 'b':
				s = append(s, '\b')
			case 't', '\t':
				s = append(s, '\t')
			case 'n':
				s = append(s, '\n')
			case 'v':
				s = append(s, '\v')
			case 'f':
				s = append(s, '\f')
			case 'r':
				s = append(s, '\r')
			case 'e':
				s = append(s, 0x1b)
			case ' ', '"', '\'', '\\':
				s = append(s, d[i])
			case 'N':
				s = utf8.AppendRune(s, 0x85)
			case '_':
				s = utf8.AppendRune(s, 0xa0)
			case 'L':
				s = utf8.AppendRune(s, 0x2028)
			case 'P':
				s = utf8.AppendRune(s, 0x2029)
			case 'x':
				n = 2
			case 'u':
				n = 4
			case 'U':
				n = 8
			default:
				p.fail()
			}
			if n > 0 {
				if i+n >= end {
					p.fail()
				}
				v, err := strconv.ParseUint(string(d[i+1:i+1+n]), 16, 32)
				if err != nil || v >= 0xd800 && v <= 0xdfff || v > 0x10ffff {
					p.fail()
				}
				s = utf8.AppendRune(s, rune(v))
				i += n
			}
		default:
			s = append(s, c)
		}
	}
	p.fail() // the scalar goes on on the next line
	return nil, 0
}

// literal reads a literal block scalar ("|", "|-" or "|+") whose header is
// at pos, of a node indented by indent.
func (p *fastYAML) literal(pos, end, indent int) {
	d := p.d
	keep, strip := false, false
	i := pos + 1
	if i < end && (d[i] == '-' || d[i] == '+') {
		keep, strip = d[i] == '+', d[i] == '-'
		i++
	}
	if i < end && d[i] != ' ' {
		p.fail()
	}
	p.trailer(i, end)
	s := p.scratch[:0]
	content := -1
	breaks := 0
	at := p.pos
	for at < len(d) {
		lineEnd := at + bytes.IndexByte(d[at:], '\n')
		n := 0
		for at+n < lineEnd && d[at+n] == ' ' {
			n++
		}
		if at+n == lineEnd { // an empty line
			if content < 0 || n > content {
				p.fail()
			}
			breaks++
			at = lineEnd + 1
			continue
		}
		if n <= indent {
			break
		}
		if content < 0 {
			content = n
		}
		if n < content {
			p.fail()
		}
		for ; breaks > 0; breaks-- {
			s = append(s, '\n')
		}
		s = append(s, d[at+content:lineEnd]...)
		breaks = 1
		at = lineEnd + 1
	}
	if content < 0 {
		p.fail()
	}
	switch {
	case keep:
		for ; breaks > 0; breaks-- {
			s = append(s, '\n')
		}
	case !strip:
		s = append(s, '\n')
	}
	p.pos = at
	p.scratch = s
	p.out = appendJSONString(p.out, s)
}

// Plain scalars resolve as yaml.v2 resolves them (resolve.go): by their
// first character, then a table of words, then number syntax.
const (
	plainString = iota
	plainNull
	plainTrue
	plainFalse
	plainInt
	plainOther // a float, a timestamp, a merge key...: left to the parser
)

var plainWords = map[string]int{
	"y": plainTrue, "Y": plainTrue, "yes": plainTrue, "Yes": plainTrue, "YES": plainTrue,
	"true": plainTrue, "True": plainTrue, "TRUE": plainTrue, "on": plainTrue, "On": plainTrue, "ON": plainTrue,
	"n": plainFalse, "N": plainFalse, "no": plainFalse, "No": plainFalse, "NO": plainFalse,
	"false": plainFalse, "False": plainFalse, "FALSE": plainFalse, "off": plainFalse, "Off": plainFalse, "OFF": plainFalse,
	"~": plainNull, "null": plainNull, "Null": plainNull, "NULL": plainNull,
	".nan": plainOther, ".NaN": plainOther, ".NAN": plainOther, ".inf": plainOther, ".Inf": plainOther, ".INF": plainOther,
	"+.inf": plainOther, "+.Inf": plainOther, "+.INF": plainOther, "-.inf": plainOther, "-.Inf": plainOther, "-.INF": plainOther,
	"<<": plainOther,
}

var yamlFloat = regexp.MustCompile(`^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`)

// resolvePlain says what yaml.v2 makes of a plain scalar (not empty).
func resolvePlain(s []byte) int {
	c := s[0]
	switch {
	case c == '+' || c == '-' || c >= '0' && c <= '9':
	case c == '.':
		if k, ok := plainWords[string(s)]; ok {
			return k
		}
		if _, err := strconv.ParseFloat(string(s), 64); err == nil {
			return plainOther
		}
		return plainString
	case bytes.IndexByte([]byte("yYnNtTfFoO~<"), c) >= 0:
		if k, ok := plainWords[string(s)]; ok {
			return k
		}
		return plainString
	default:
		return plainString
	}
	if k, ok := plainWords[string(s)]; ok {
		return k
	}
	// A date ("2006-01-02...") may be a timestamp.
	if len(s) > 4 && s[4] == '-' && allDigits(s[:4]) {
		return plainOther
	}
	// Quick answers, the same as below: a decimal integer; and what has a
	// character no number has, or two dots (an address), is a string.
	digits := s
	if c == '-' {
		digits = s[1:]
	}
	if len(digits) > 0 && len(digits) <= 18 && allDigits(digits) && (digits[0] != '0' || len(digits) == 1) {
		return plainInt
	}
	dots := 0
	for _, c := range s {
		if c == '.' {
			dots++
		}
		if !numberByte[c] || dots > 1 {
			return plainString
		}
	}
	plain := string(bytes.ReplaceAll(s, []byte("_"), nil))
	if _, err := strconv.ParseInt(plain, 0, 64); err == nil {
		return plainInt
	}
	if _, err := strconv.ParseUint(plain, 0, 64); err == nil {
		return plainOther
	}
	if yamlFloat.MatchString(plain) || len(plain) > 2 && (plain[:2] == "0b" || plain[:3] == "-0b") {
		return plainOther
	}
	return plainString
}

// plainFirst: a plain scalar may begin at d[i] (YAML's ns-plain-first: not
// an indicator, but "-", "?" and ":" before a character that is safe).
func plainFirst(d []byte, i, end int, flow bool) bool {
	switch c := d[i]; c {
	case '-', '?', ':':
		if i+1 == end {
			return false
		}
		n := d[i+1]
		return n != ' ' && n != '\t' && !(flow && isFlowIndicator(n))
	case ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '\'', '"', '%', '@', '`', ' ', '\t':
		return false
	}
	return true
}

// numberByte: a byte of what strconv and yaml.v2 may read as a number.
var numberByte = func() (t [256]bool) {
	for _, c := range "0123456789abcdefABCDEFxXoO_+-." {
		t[c] = true
	}
	return t
}()

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// plain writes a plain scalar's JSON.
func (p *fastYAML) plain(s []byte) {
	switch resolvePlain(s) {
	case plainString:
		p.out = appendJSONString(p.out, s)
	case plainNull:
		p.out = append(p.out, "null"...)
	case plainTrue:
		p.out = append(p.out, "true"...)
	case plainFalse:
		p.out = append(p.out, "false"...)
	case plainInt:
		v, _ := strconv.ParseInt(string(bytes.ReplaceAll(s, []byte("_"), nil)), 0, 64)
		p.out = strconv.AppendInt(p.out, v, 10)
	default:
		p.fail()
	}
}

// Keys: a mapping's keys are checked for duplicates (an error in YAML).
func (p *fastYAML) pushKeys() {
	p.frameStarts = append(p.frameStarts, len(p.keys))
	p.frameSetsBeforeStart = append(p.frameSetsBeforeStart, len(p.sets))
}

func (p *fastYAML) popKeys() {
	n := len(p.frameStarts) - 1
	p.keys = p.keys[:p.frameStarts[n]]
	p.sets = p.sets[:p.frameSetsBeforeStart[n]]
	p.frameStarts, p.frameSetsBeforeStart = p.frameStarts[:n], p.frameSetsBeforeStart[:n]
}

func (p *fastYAML) addKey(key []byte) {
	n := len(p.frameStarts) - 1
	if len(p.sets) > p.frameSetsBeforeStart[n] { // a large mapping: a set
		set := p.sets[len(p.sets)-1]
		if set[string(key)] {
			p.fail()
		}
		set[string(key)] = true
		return
	}
	keys := p.keys[p.frameStarts[n]:]
	for _, k := range keys {
		if bytes.Equal(k, key) {
			p.fail()
		}
	}
	if len(keys) < 32 {
		p.keys = append(p.keys, key)
		return
	}
	set := make(map[string]bool, 2*len(keys))
	for _, k := range keys {
		set[string(k)] = true
	}
	set[string(key)] = true
	p.keys = p.keys[:p.frameStarts[n]]
	p.sets = append(p.sets, set)
}

// appendJSONString appends s as a JSON string.
func appendJSONString(out, s []byte) []byte {
	out = append(out, '"')
	start := 0
	for i, c := range s {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		out = append(out, s[start:i]...)
		switch c {
		case '"', '\\':
			out = append(out, '\\', c)
		case '\n':
			out = append(out, '\\', 'n')
		case '\t':
			out = append(out, '\\', 't')
		default:
			out = append(out, '\\', 'u', '0', '0', "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
		}
		start = i + 1
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}
