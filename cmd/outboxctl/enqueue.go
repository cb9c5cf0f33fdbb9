package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/v3/pkg/kick"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

const enqueueUsage = `usage: outboxctl enqueue [--json] < events.jsonl

Commits the events read from standard input, one JSON object a line,
  {"topic":"order.created","partition_key":"order:1","payload":{"order_id":"1"},"headers":{"x-request-id":"r1"}}
each in a transaction of its own through the producer API (outbox.Enqueue), and prints each
event's id as it commits. With RELAY_FUNCTION set (the stack's RelayFunctionArn output; AWS
credentials and region from the environment, AWS_ENDPOINT_URL_LAMBDA honoured) each commit
kicks the relay Lambda (package kick), and the command waits for its last kick before it
exits; without it the relay's schedule delivers them. A line that is not a valid event stops
the command (exit 2) after the lines before it were committed; blank lines are skipped.`

// enqueueLine is one line of input.
type enqueueLine struct {
	Topic        string            `json:"topic"`
	PartitionKey string            `json:"partition_key"`
	Payload      json.RawMessage   `json:"payload"`
	Headers      map[string]string `json:"headers"`
}

// enqueued is one line of --json output.
type enqueued struct {
	Line int       `json:"line"`
	ID   outbox.ID `json:"id"`
}

func runEnqueue(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "enqueue").withUsage(enqueueUsage)
	asJSON := fs.Bool("json", false, `print {"line":N,"id":ID} per event instead of the bare id`)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	pool, err := openPool(ctx, e)
	if err != nil {
		return err
	}
	defer pool.Close()
	var w outbox.Waker
	if fn := e.getenv("RELAY_FUNCTION"); fn != "" {
		k, err := kick.New(ctx, kick.Config{Function: fn, DB: pool, Logger: slog.New(slog.NewTextHandler(e.stderr, nil))})
		if err != nil {
			return usageErr(fmt.Errorf("RELAY_FUNCTION: %w", err))
		}
		defer closeKicker(e, k)
		w = k
	}
	in := e.stdin
	if in == nil {
		in = strings.NewReader("")
	}
	return enqueueLines(ctx, e, in, pool, w, *asJSON)
}

// enqueueLines commits each line of in in a transaction of its own, kicking w after each.
func enqueueLines(ctx context.Context, e env, in io.Reader, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, w outbox.Waker, asJSON bool) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 4<<20) // a payload up to the relay's default 1 MB and then some
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		ev, err := parseEnqueueLine(text)
		if err != nil {
			return usageErr(fmt.Errorf("line %d: %w", n, err))
		}
		var id outbox.ID
		err = outbox.BeginFunc(ctx, db, w, func(tx pgx.Tx) error {
			var err error
			id, err = outbox.Enqueue(ctx, tx, ev)
			return err
		})
		var invalid *outbox.ValidationError
		switch {
		case errors.As(err, &invalid):
			return usageErr(fmt.Errorf("line %d: %w", n, err))
		case err != nil:
			return fmt.Errorf("line %d: commit event: %w", n, err)
		}
		if asJSON {
			b, _ := json.Marshal(enqueued{Line: n, ID: id})
			fmt.Fprintln(e.stdout, string(b))
		} else {
			fmt.Fprintln(e.stdout, id)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read standard input: %w", err)
	}
	return nil
}

func parseEnqueueLine(text string) (outbox.Event, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	var l enqueueLine
	if err := dec.Decode(&l); err != nil {
		return outbox.Event{}, fmt.Errorf(`decode event: %w (want {"topic":...,"partition_key":...,"payload":{...}})`, err)
	}
	if len(l.Payload) == 0 {
		return outbox.Event{}, errors.New(`decode event: "payload" is missing`)
	}
	return outbox.Event{Topic: l.Topic, PartitionKey: l.PartitionKey, Payload: l.Payload, Headers: l.Headers}, nil
}

// closeKicker sends the kick still owed and waits for the last one, for at most 10 s.
func closeKicker(e env, k *kick.Kicker) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := k.Close(ctx); err != nil {
		fmt.Fprintf(e.stderr, "outboxctl enqueue: %v; the relay's schedule delivers the events\n", err)
	}
	if s := k.Stats(); s.Failed > 0 {
		fmt.Fprintf(e.stderr, "outboxctl enqueue: %d of %d kicks failed; the relay's schedule delivers the events\n", s.Failed, s.Sent+s.Failed)
	}
}
