package qstashtest

import (
	"encoding/json"
	"unicode/utf8"
	"unsafe"
)

// decodeBatchItems decodes a /v2/batch body. Parsing it with encoding/json cost about
// 23 µs per message, profiled under the drain bench: the largest single cost on the
// machine after Postgres, paid by the relay's own benchmark because this server shares
// its cores. decodeBatchFast reads the shape publishers send and gives up on anything
// else, which encoding/json then decodes (or refuses) exactly as before; FuzzBatchDecode
// holds the two to the same answers.
//
// The fast path reads names and values as substrings of the request body, and each
// message's body into one buffer sized once: a held message keeps its batch's body
// instead of a dozen small allocations of its own (measured under the drain bench: the
// server's allocations and the GC work on the messages it holds were its largest cost
// after decoding).
func decodeBatchItems(data []byte) ([]batchRequestItem, error) {
	if items, ok := decodeBatchFast(data); ok {
		return items, nil
	}
	var items []batchRequestItem
	err := json.Unmarshal(data, &items)
	return items, err
}

// decodeBatchFast decodes an array of objects whose keys are exactly destination, headers,
// body and queue (each at most once), with string values and a headers object of
// strings, and strings free of \u escapes and control characters. It reports false for
// anything else, valid or not. Headers come back as pairs (headerPairs), in the order sent.
func decodeBatchFast(data []byte) ([]batchRequestItem, bool) {
	// The body is read into a buffer of its own that nothing writes to again, so the
	// strings can share its bytes.
	s := scanner{b: unsafe.String(unsafe.SliceData(data), len(data))}
	if !s.consume('[') {
		return nil, false
	}
	items := make([]batchRequestItem, 0, 16)
	if s.consume(']') {
		return items, s.end()
	}
	for {
		it, ok := s.item()
		if !ok {
			return nil, false
		}
		items = append(items, it)
		if s.consume(',') {
			continue
		}
		if s.consume(']') {
			return items, s.end()
		}
		return nil, false
	}
}

type scanner struct {
	b string
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// consume skips white space and then c, if c is next.
func (s *scanner) consume(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) end() bool {
	s.space()
	return s.i == len(s.b)
}

func (s *scanner) item() (batchRequestItem, bool) {
	var it batchRequestItem
	if !s.consume('{') {
		return it, false
	}
	if s.consume('}') {
		return it, true
	}
	var seen [4]bool
	for {
		key, ok := s.str()
		if !ok || !s.consume(':') {
			return it, false
		}
		f := -1
		switch key {
		case "destination":
			f = 0
		case "headers":
			f = 1
		case "body":
			f = 2
		case "queue":
			f = 3
		}
		if f < 0 || seen[f] {
			return it, false
		}
		seen[f] = true
		switch f {
		case 0:
			if it.Destination, ok = s.str(); !ok {
				return it, false
			}
		case 1:
			if it.headerPairs, ok = s.headers(); !ok {
				return it, false
			}
		case 2:
			if it.body, ok = s.bytes(); !ok {
				return it, false
			}
		default:
			v, ok := s.str()
			if !ok {
				return it, false
			}
			it.Queue = &v
		}
		if s.consume(',') {
			continue
		}
		return it, s.consume('}')
	}
}

// headers reads an object of strings as name, value pairs (never nil: {} is empty pairs).
func (s *scanner) headers() ([]string, bool) {
	if !s.consume('{') {
		return nil, false
	}
	pairs := make([]string, 0, 24)
	if s.consume('}') {
		return pairs, true
	}
	for {
		k, ok := s.str()
		if !ok || !s.consume(':') {
			return nil, false
		}
		v, ok := s.str()
		if !ok {
			return nil, false
		}
		pairs = append(pairs, k, v)
		if s.consume(',') {
			continue
		}
		return pairs, s.consume('}')
	}
}

// str reads a string, a substring of the input unless it had escapes.
func (s *scanner) str() (string, bool) {
	raw, escaped, ok := s.raw()
	if !ok || !escaped {
		return raw, ok
	}
	return string(unescape(raw)), true
}

// bytes reads a string into a slice of its own.
func (s *scanner) bytes() ([]byte, bool) {
	raw, escaped, ok := s.raw()
	if !ok {
		return nil, false
	}
	if !escaped {
		return []byte(raw), true
	}
	return unescape(raw), true
}

// raw reads a string as it was sent, between its quotes, and reports whether it has
// escapes. It gives up on \u escapes (encoding/json's handling of surrogates is not worth
// repeating here), control characters and invalid UTF-8.
func (s *scanner) raw() (raw string, escaped, ok bool) {
	if !s.consume('"') {
		return "", false, false
	}
	start, ascii := s.i, true
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			raw = s.b[start:s.i]
			s.i++
			return raw, escaped, ascii || utf8.ValidString(raw)
		case c == '\\':
			if s.i+1 >= len(s.b) || !simpleEscape(s.b[s.i+1]) {
				return "", false, false
			}
			escaped = true
			s.i += 2
		case c < 0x20:
			return "", false, false
		default:
			if c >= utf8.RuneSelf {
				ascii = false
			}
			s.i++
		}
	}
	return "", false, false
}

func simpleEscape(e byte) bool {
	switch e {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return true
	}
	return false
}

// unescape decodes raw, whose escapes raw checked, into a buffer sized once.
func unescape(raw string) []byte {
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		switch e := raw[i]; e {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		default:
			out = append(out, e)
		}
	}
	return out
}
