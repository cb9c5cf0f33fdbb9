// Package logtest captures what components log during a test: a Buffer any number of
// goroutines may write to, and a JSON slog.Logger over it whose lines a test can decode.
package logtest

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
)

// Buffer is an io.Writer safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Lines decodes every line written so far as a JSON object; a line that is not one is
// returned as {"raw": line}, so a test sees it instead of losing it.
func (b *Buffer) Lines() []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l == "" {
			continue
		}
		m := map[string]any{}
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			m = map[string]any{"raw": l}
		}
		out = append(out, m)
	}
	return out
}

// New returns a JSON logger at debug level writing to a new Buffer, and the Buffer.
func New() (*slog.Logger, *Buffer) {
	b := &Buffer{}
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}
