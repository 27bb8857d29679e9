package cluster

import (
	"bytes"
	"strconv"
	"sync"
	"unicode/utf8"
)

// yamlLexer follows a YAML document line by line as far as cutting a List
// into its items needs: which lines continue a quoted scalar, a flow
// collection or a block scalar begun before (they are not structure),
// each line's indentation, sequence entry and key, and whether the
// document has anchors or aliases (items that may refer to each other).
type yamlLexer struct {
	quote       byte // the quote of a quoted scalar still open
	flow        int  // flow collections still open
	block       bool // in a block scalar ...
	blockIndent int  // ... whose lines are indented more than this
	anchors     bool // an anchor or alias was seen
}

// yamlLine is what the lexer found of one line.
type yamlLine struct {
	cont   bool   // the line continues a scalar or collection begun before
	blank  bool   // spaces, and maybe a comment (and not cont)
	indent int    // leading spaces
	dash   bool   // the line begins with a block sequence entry ("- ")
	key    []byte // the line begins with this plain key ("key:")
	empty  bool   // the key has no value on the line
	anchor bool   // the line has an anchor or alias
}

// line reads one line (without its line break).
func (lx *yamlLexer) line(b []byte) (l yamlLine) {
	n := 0
	for n < len(b) && b[n] == ' ' {
		n++
	}
	l.indent = n
	if lx.block {
		if n == len(b) || n > lx.blockIndent {
			l.cont = true
			return l
		}
		lx.block = false
	}
	if lx.quote != 0 || lx.flow > 0 {
		l.cont = true
	} else if n == len(b) || b[n] == '#' {
		l.blank = true
		return l
	}
	node := -1 // the column of the node a block scalar here would belong to
	first := !l.cont
	for pos := n; pos < len(b); {
		if lx.quote != 0 {
			end := closeQuote(b, pos, lx.quote)
			if end < 0 {
				return l
			}
			lx.quote = 0
			pos = end
			first = false
			continue
		}
		c := b[pos]
		switch {
		case c == ' ' || c == '\t':
			pos++
			continue
		case c == '#' && (pos == 0 || b[pos-1] == ' ' || b[pos-1] == '\t'):
			return l
		case c == '"' || c == '\'':
			// A quoted scalar: a key if ":" follows its end.
			start := pos
			lx.quote = c
			end := closeQuote(b, pos+1, c)
			if end < 0 {
				return l
			}
			lx.quote = 0
			pos = end
			if pos < len(b) && b[pos] == ':' && (pos+1 == len(b) || isSpace(b[pos+1]) || lx.flow > 0) {
				node = start
				pos++
			}
		case c == '[' || c == '{':
			lx.flow++
			pos++
		case c == ']' || c == '}':
			if lx.flow > 0 {
				lx.flow--
			}
			pos++
		case c == ',' && lx.flow > 0:
			pos++
		case (c == '-' || c == '?' || c == ':') && (pos+1 == len(b) || isSpace(b[pos+1])):
			if c == '-' && lx.flow == 0 {
				if first {
					l.dash = true
				}
				node = pos
			}
			pos++
		case c == '&' || c == '*':
			l.anchor, lx.anchors = true, true
			pos = tokenEnd(b, pos, lx.flow > 0)
		case c == '!':
			pos = tokenEnd(b, pos, lx.flow > 0)
		case (c == '|' || c == '>') && lx.flow == 0:
			lx.block, lx.blockIndent = true, node
			return l
		default:
			start := pos
			end, key := plainEnd(b, pos, lx.flow > 0)
			pos = end
			if key {
				if first && start == n {
					l.key = b[start:end]
					rest := bytes.TrimLeft(b[end+1:], " \t")
					l.empty = len(rest) == 0 || rest[0] == '#'
				}
				node = start
				pos++
			}
		}
		first = false
	}
	return l
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' }

func isFlowIndicator(c byte) bool { return c == ',' || c == '[' || c == ']' || c == '{' || c == '}' }

// closeQuote returns the index after the quote that closes a scalar
// quoted by q whose text goes on at pos, or -1 if the line ends first.
func closeQuote(b []byte, pos int, q byte) int {
	for pos < len(b) {
		switch b[pos] {
		case '\\':
			if q == '"' {
				pos += 2
				continue
			}
		case q:
			if q == '\'' && pos+1 < len(b) && b[pos+1] == '\'' {
				pos += 2
				continue
			}
			return pos + 1
		}
		pos++
	}
	return -1
}

// tokenEnd is the end of an anchor, alias or tag at pos.
func tokenEnd(b []byte, pos int, flow bool) int {
	for pos < len(b) && !isSpace(b[pos]) && !(flow && isFlowIndicator(b[pos])) {
		pos++
	}
	return pos
}

// plainEnd returns the end of the plain scalar at pos, and whether it is
// a key (a ":" and a space, or the end of the line, follow it; end is at
// the ":").
func plainEnd(b []byte, pos int, flow bool) (int, bool) {
	start := pos
	for ; pos < len(b); pos++ {
		switch c := b[pos]; {
		case c == ':' && (pos+1 == len(b) || isSpace(b[pos+1]) || flow && isFlowIndicator(b[pos+1])):
			return pos, true
		case c == '#' && pos > start && isSpace(b[pos-1]):
			return pos, false
		case flow && isFlowIndicator(c):
			return pos, false
		}
	}
	return pos, false
}

// jsonClean reports whether the YAML parser would read JSON (valid JSON,
// as the decoder will check) as JSON reads it: the YAML path's strictness
// and errors without it. It says no for what YAML refuses and JSON takes
// (characters YAML does not print, escapes of UTF-16 surrogates and of
// "/"), and for what YAML reads otherwise: duplicate keys (an error in
// YAML, to be reported in its words) and keys longer than YAML's 1024
// characters. One pass.
func jsonClean(b []byte) bool {
	type frame = keyFrame
	sc := keyScratches.Get().(*keyScratch)
	stack, keys := sc.stack[:0], sc.keys[:0]
	defer func() {
		clear(stack[:cap(stack)])
		clear(keys[:cap(keys)])
		sc.stack, sc.keys = stack[:0], keys[:0]
		keyScratches.Put(sc)
	}()
	wantKey := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '{':
			stack = append(stack, frame{object: true, keys: len(keys)})
			wantKey = true
		case '[':
			stack = append(stack, frame{keys: len(keys)})
			wantKey = false
		case '}', ']':
			if len(stack) == 0 {
				return true // not JSON: the decoder says so
			}
			keys = keys[:stack[len(stack)-1].keys]
			stack = stack[:len(stack)-1]
			wantKey = false
		case ',':
			wantKey = len(stack) > 0 && stack[len(stack)-1].object
		case ' ', '\t', '\n', '\r', ':':
		case '"':
			start := i
			esc := false
			for i++; i < len(b); i++ {
				for i < len(b) && plainStringByte[b[i]] {
					i++
				}
				if i == len(b) {
					break
				}
				c := b[i]
				if c == '"' {
					break
				}
				switch {
				case c == '\\':
					esc = true
					if i+1 < len(b) && b[i+1] == '/' {
						return false // YAML has no such escape
					}
					if i+5 < len(b) && b[i+1] == 'u' {
						if v, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16); err == nil && v >= 0xd800 && v <= 0xdfff {
							return false
						}
					}
					i++
				case c < utf8.RuneSelf:
					if c != '\t' {
						return false // a control character
					}
				default:
					r, size := utf8.DecodeRune(b[i:])
					if r == utf8.RuneError && size == 1 || !(r == 0x85 || r >= 0xa0 && r <= 0xd7ff || r >= 0xe000 && r <= 0xfffd && r != 0xfeff || r >= 0x10000) {
						return false
					}
					i += size - 1
				}
			}
			if !wantKey {
				continue
			}
			wantKey = false
			key := b[start:min(i+1, len(b))]
			if len(key) > 1000 {
				return false
			}
			if esc {
				s, err := strconv.Unquote(string(key))
				if err != nil {
					return false
				}
				key = []byte(`"` + s + `"`)
			}
			f := &stack[len(stack)-1]
			if f.set != nil {
				if f.set[string(key)] {
					return false
				}
				f.set[string(key)] = true
				continue
			}
			for _, k := range keys[f.keys:] {
				if bytes.Equal(k, key) {
					return false
				}
			}
			keys = append(keys, key)
			if len(keys)-f.keys > 32 {
				f.set = map[string]bool{}
				for _, k := range keys[f.keys:] {
					f.set[string(k)] = true
				}
				keys = keys[:f.keys]
			}
		default:
			if c < 0x20 || c >= 0x7f {
				return false // outside strings: not JSON, or not printable
			}
		}
	}
	return true
}

// plainStringByte: a byte of a JSON string that needs no look.
var plainStringByte = func() (t [256]bool) {
	for c := 0x20; c < 0x7f; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

type keyFrame struct {
	object bool
	keys   int // where its keys begin in keys
	set    map[string]bool
}

type keyScratch struct {
	stack []keyFrame
	keys  [][]byte
}

var keyScratches = sync.Pool{New: func() any { return new(keyScratch) }}

// quickHead reads what analyze's head decode reads (apiVersion, kind,
// metadata.name and metadata.namespace) from JSON without duplicate keys,
// when they are strings without escapes and there are no "items"; ok is
// false for anything else, and the decoder reads the head. The JSON is
// not checked beyond what this reads.
func quickHead(b []byte) (apiVersion, kind, name, namespace string, ok bool) {
	i := skipJSONSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return
	}
	fields := func(i int, each func(key []byte, i int) (int, bool)) (int, bool) {
		i = skipJSONSpace(b, i+1)
		if i < len(b) && b[i] == '}' {
			return i + 1, true
		}
		for i < len(b) {
			key, j, ok := jsonPlainString(b, i)
			if !ok {
				return 0, false
			}
			if i = skipJSONSpace(b, j); i == len(b) || b[i] != ':' {
				return 0, false
			}
			if i, ok = each(key, skipJSONSpace(b, i+1)); !ok {
				return 0, false
			}
			switch i = skipJSONSpace(b, i); {
			case i < len(b) && b[i] == '}':
				return i + 1, true
			case i < len(b) && b[i] == ',':
				i = skipJSONSpace(b, i+1)
			default:
				return 0, false
			}
		}
		return 0, false
	}
	str := func(to *string, i int) (int, bool) {
		s, j, ok := jsonPlainString(b, i)
		*to = string(s)
		return j, ok
	}
	_, ok = fields(i, func(key []byte, i int) (int, bool) {
		switch string(key) {
		case "apiVersion":
			return str(&apiVersion, i)
		case "kind":
			return str(&kind, i)
		case "items":
			return 0, false
		case "metadata":
			if i == len(b) || b[i] != '{' {
				return 0, false
			}
			return fields(i, func(key []byte, i int) (int, bool) {
				switch string(key) {
				case "name":
					return str(&name, i)
				case "namespace":
					return str(&namespace, i)
				}
				return skipJSONValue(b, i)
			})
		}
		return skipJSONValue(b, i)
	})
	return
}

func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// jsonPlainString reads a string without escapes at i.
func jsonPlainString(b []byte, i int) ([]byte, int, bool) {
	if i == len(b) || b[i] != '"' {
		return nil, 0, false
	}
	j := bytes.IndexAny(b[i+1:], "\"\\")
	if j < 0 || b[i+1+j] != '"' {
		return nil, 0, false
	}
	return b[i+1 : i+1+j], i + j + 2, true
}

// skipJSONValue returns the end of the value at i (checked no further than
// its strings and brackets).
func skipJSONValue(b []byte, i int) (int, bool) {
	depth := 0
	for i < len(b) {
		switch c := b[i]; c {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if i >= len(b) {
				return 0, false
			}
			i++
			if depth == 0 {
				return i, true
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i, true
			}
			if depth--; depth == 0 {
				return i + 1, true
			}
		case ',':
			if depth == 0 {
				return i, true
			}
		}
		i++
	}
	return i, depth == 0
}

// compactJSON appends src without the white space between its tokens, if
// it reads as JSON's tokens (strings, numbers, true, false, null,
// brackets, commas and colons); false for anything else (YAML's flow
// style, comments), which is then read as it is.
func compactJSON(dst, src []byte) ([]byte, bool) {
	for i := 0; i < len(src); {
		switch jsonClass[src[i]] {
		case jsonSpace:
			i++
		case jsonPunct:
			dst = append(dst, src[i])
			i++
		case jsonQuote:
			end := stringEnd(src, i+1)
			if end < 0 {
				return dst, false
			}
			dst = append(dst, src[i:end]...)
			i = end
		case jsonWord:
			j := i
			for j < len(src) && jsonClass[src[j]] == jsonWord {
				j++
			}
			w := src[i:j]
			if c := w[0]; c >= 'a' && c <= 'z' {
				if s := string(w); s != "true" && s != "false" && s != "null" {
					return dst, false
				}
			} else {
				for _, c := range w {
					if !(c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E') {
						return dst, false
					}
				}
			}
			dst = append(dst, w...)
			i = j
		default:
			return dst, false
		}
	}
	return dst, true
}

// Classes of bytes for compactJSON.
const (
	jsonOther = iota
	jsonSpace
	jsonPunct
	jsonQuote
	jsonWord
)

var jsonClass = func() (t [256]byte) {
	for _, c := range " \t\r\n" {
		t[c] = jsonSpace
	}
	for _, c := range "{}[],:" {
		t[c] = jsonPunct
	}
	t['"'] = jsonQuote
	for _, c := range "-+.0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" {
		t[c] = jsonWord
	}
	return t
}()
