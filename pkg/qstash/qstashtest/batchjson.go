package qstashtest

import (
	"encoding/json"
	"unicode/utf8"
)

// decodeBatchItems decodes a /v2/batch body. Parsing it with encoding/json cost about
// 23 µs per message, profiled under the drain bench: the largest single cost on the
// machine after Postgres, paid by the relay's own benchmark because this server shares
// its cores. decodeBatchFast reads the shape publishers send and gives up on anything
// else, which encoding/json then decodes (or refuses) exactly as before; FuzzBatchDecode
// holds the two to the same answers.
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
// anything else, valid or not.
func decodeBatchFast(data []byte) ([]batchRequestItem, bool) {
	s := scanner{b: data}
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
	b []byte
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
			if it.Headers, ok = s.headers(); !ok {
				return it, false
			}
		default:
			v, ok := s.str()
			if !ok {
				return it, false
			}
			if f == 2 {
				it.Body = &v
			} else {
				it.Queue = &v
			}
		}
		if s.consume(',') {
			continue
		}
		return it, s.consume('}')
	}
}

func (s *scanner) headers() (map[string]string, bool) {
	if !s.consume('{') {
		return nil, false
	}
	h := make(map[string]string, 12)
	if s.consume('}') {
		return h, true
	}
	for {
		kb, ok := s.strBytes()
		if !ok || !s.consume(':') {
			return nil, false
		}
		k := internHeader(kb)
		v, ok := s.str()
		if !ok {
			return nil, false
		}
		h[k] = v
		if s.consume(',') {
			continue
		}
		return h, s.consume('}')
	}
}

// str reads a string. It gives up on \u escapes (encoding/json's handling of surrogates
// is not worth repeating here), control characters and invalid UTF-8.
func (s *scanner) str() (string, bool) {
	b, ok := s.strBytes()
	return string(b), ok
}

// strBytes is str without the copy: the result aliases the input unless it had escapes.
func (s *scanner) strBytes() ([]byte, bool) {
	if !s.consume('"') {
		return nil, false
	}
	var buf []byte
	seg, ascii := s.i, true
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			out := s.b[seg:s.i]
			if buf != nil {
				out = append(buf, out...)
			}
			s.i++
			return out, ascii || utf8.Valid(out)
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return nil, false
			}
			buf = append(buf, s.b[seg:s.i]...)
			switch e := s.b[s.i+1]; e {
			case '"', '\\', '/':
				buf = append(buf, e)
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			default:
				return nil, false
			}
			s.i += 2
			seg = s.i
		case c < 0x20:
			return nil, false
		default:
			if c >= utf8.RuneSelf {
				ascii = false
			}
			s.i++
		}
	}
	return nil, false
}

// internHeader returns the shared copy of the header names every relay message carries,
// so a held message does not keep its own.
func internHeader(k []byte) string {
	switch string(k) {
	case "Content-Type":
		return "Content-Type"
	case "Upstash-Forward-X-Outbox-Id":
		return "Upstash-Forward-X-Outbox-Id"
	case "Upstash-Forward-X-Outbox-Generation":
		return "Upstash-Forward-X-Outbox-Generation"
	case "Upstash-Deduplication-Id":
		return "Upstash-Deduplication-Id"
	case "Upstash-Label":
		return "Upstash-Label"
	case "Upstash-Retries":
		return "Upstash-Retries"
	case "Upstash-Failure-Callback":
		return "Upstash-Failure-Callback"
	case "Upstash-Flow-Control-Key":
		return "Upstash-Flow-Control-Key"
	case "Upstash-Flow-Control-Value":
		return "Upstash-Flow-Control-Value"
	}
	return string(k)
}
