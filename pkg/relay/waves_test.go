package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/outboxstore"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// The batch logic's pure steps, and publishBatch over a scripted publisher: no database.

// msgs builds messages from "key:id" or "key:id:attempt" specs.
func msgs(specs ...string) []outbox.Message {
	out := make([]outbox.Message, len(specs))
	for i, s := range specs {
		var key string
		var id, attempt int
		if n, _ := fmt.Sscanf(s, "%1s:%d:%d", &key, &id, &attempt); n < 2 {
			panic("bad message spec " + s)
		}
		out[i] = outbox.Message{ID: outbox.ID(id), PartitionKey: key, Attempt: max(attempt, 1)}
	}
	return out
}

func ids(ms []outbox.Message) []outbox.ID {
	var out []outbox.ID
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

func runIDLists(runs [][]outbox.Message) [][]outbox.ID {
	var out [][]outbox.ID
	for _, r := range runs {
		out = append(out, ids(r))
	}
	return out
}

func TestHoldUndecodable(t *testing.T) {
	t.Parallel()
	bad := func(key string, id int) outboxstore.Failure {
		return outboxstore.Failure{ID: outbox.ID(id), PartitionKey: key}
	}
	cases := []struct {
		name         string
		undecodable  []outboxstore.Failure
		msgs         []outbox.Message
		wantPending  []outbox.ID
		wantReleased []outbox.ID
	}{
		{"nothing undecodable", nil, msgs("a:1", "b:2"), []outbox.ID{1, 2}, nil},
		{"later events of the key wait", []outboxstore.Failure{bad("a", 2)}, msgs("a:1", "a:3", "b:4", "a:5"), []outbox.ID{1, 4}, []outbox.ID{3, 5}},
		{"the smallest failed id holds", []outboxstore.Failure{bad("a", 2), bad("a", 6)}, msgs("a:1", "a:3", "a:7"), []outbox.ID{1}, []outbox.ID{3, 7}},
		{"other keys untouched", []outboxstore.Failure{bad("c", 1)}, msgs("a:2", "b:3"), []outbox.ID{2, 3}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pending, released := holdUndecodable(tc.undecodable, tc.msgs)
			if got := ids(pending); !reflect.DeepEqual(got, tc.wantPending) {
				t.Errorf("pending = %v, want %v", got, tc.wantPending)
			}
			if !reflect.DeepEqual(released, tc.wantReleased) {
				t.Errorf("released = %v, want %v", released, tc.wantReleased)
			}
		})
	}
}

func TestKeyRunsAndWaves(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		fifo  bool
		msgs  []outbox.Message
		runs  [][]outbox.ID
		waves [][]outbox.ID // every wave when no key is held
	}{
		{"empty", true, nil, nil, nil},
		{"fifo: one run per key, keys by first event", true, msgs("b:1", "a:2", "b:3", "c:4", "b:5"),
			[][]outbox.ID{{1, 3, 5}, {2}, {4}}, [][]outbox.ID{{1, 2, 4}, {3}, {5}}},
		{"publish: one run, one wave", false, msgs("b:1", "a:2", "b:3"),
			[][]outbox.ID{{1, 2, 3}}, [][]outbox.ID{{1, 2, 3}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runs := keyRuns(tc.msgs, tc.fifo)
			if got := runIDLists(runs); !reflect.DeepEqual(got, tc.runs) {
				t.Fatalf("keyRuns = %v, want %v", got, tc.runs)
			}
			var waves [][]outbox.ID
			for len(runs) > 0 {
				before := runIDLists(runs)
				var wave []outbox.Message
				wave, runs = nextWave(runs, tc.fifo)
				waves = append(waves, ids(wave))
				runs, _, _ = advance(runs, nil, nil)
				if len(waves) > len(tc.msgs) {
					t.Fatalf("nextWave does not progress: runs %v", before)
				}
			}
			if !reflect.DeepEqual(waves, tc.waves) {
				t.Errorf("waves = %v, want %v", waves, tc.waves)
			}
		})
	}
}

func TestNextWaveLeavesRunsAlone(t *testing.T) {
	t.Parallel()
	runs := keyRuns(msgs("a:1", "a:2", "b:3"), true)
	_, _ = nextWave(runs, true)
	if got, want := runIDLists(runs), [][]outbox.ID{{1, 2}, {3}}; !reflect.DeepEqual(got, want) {
		t.Errorf("runs after nextWave = %v, want %v", got, want)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	policy := retryPolicy{maxAttempts: 3, base: time.Minute, max: time.Hour, rand: func() float64 { return 0.5 }}
	quota := &publish.DeferError{Reason: publish.DeferQuota}
	outage := &publish.DeferError{Reason: publish.DeferOutage}
	transient := errors.New("503 from the queue")
	permanent := publish.Permanent(fmt.Errorf("400 bad destination"))
	cases := []struct {
		name    string
		wave    []outbox.Message
		errs    []error
		want    marks
		defers  []*publish.DeferError
		held    map[string]bool
		freed   map[string]bool
		retryIn []time.Duration
	}{
		{name: "all published", wave: msgs("a:1", "b:2"), errs: []error{nil, nil},
			want: marks{published: []outbox.ID{1, 2}}, held: map[string]bool{}, freed: map[string]bool{}},
		{name: "retryable holds its key", wave: msgs("a:1", "b:2:2"), errs: []error{nil, transient},
			want: marks{published: []outbox.ID{1}, retries: []outboxstore.Retry{{ID: 2, Error: transient.Error()}}},
			held: map[string]bool{"b": true}, freed: map[string]bool{},
			retryIn: []time.Duration{backoff(2, time.Minute, time.Hour, 0.5)}},
		{name: "retry budget spent: dead letter frees the key", wave: msgs("a:1:3"), errs: []error{transient},
			want: marks{dead: []outboxstore.Failure{{ID: 1, PartitionKey: "a",
				Error: "retry budget exhausted after 3 attempts: " + transient.Error()}}},
			held: map[string]bool{"a": true}, freed: map[string]bool{"a": true}},
		{name: "permanent: dead letter", wave: msgs("a:1", "b:2"), errs: []error{permanent, nil},
			want: marks{published: []outbox.ID{2}, dead: []outboxstore.Failure{{ID: 1, PartitionKey: "a", Error: permanent.Error()}}},
			held: map[string]bool{"a": true}, freed: map[string]bool{"a": true}},
		{name: "deferrals are released, each kept", wave: msgs("a:1", "b:2", "c:3"), errs: []error{quota, nil, outage},
			want:   marks{published: []outbox.ID{2}, released: []outbox.ID{1, 3}},
			defers: []*publish.DeferError{quota, outage}, held: map[string]bool{}, freed: map[string]bool{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			results := make([]publish.Result, len(tc.errs))
			for i, err := range tc.errs {
				results[i] = publish.Result{Err: err}
			}
			w := classify(tc.wave, results, policy)
			var delays []time.Duration
			for i := range w.retries {
				delays = append(delays, w.retries[i].Delay)
				w.retries[i].Delay = 0
			}
			if !reflect.DeepEqual(w.marks, tc.want) {
				t.Errorf("outcome = %+v, want %+v", w.marks, tc.want)
			}
			if !reflect.DeepEqual(delays, tc.retryIn) {
				t.Errorf("retry delays = %v, want %v", delays, tc.retryIn)
			}
			if !reflect.DeepEqual(w.deferred, tc.defers) {
				t.Errorf("deferred = %v, want %v", w.deferred, tc.defers)
			}
			if !reflect.DeepEqual(w.held, tc.held) || !reflect.DeepEqual(w.freed, tc.freed) {
				t.Errorf("held, freed = %v, %v, want %v, %v", w.held, w.freed, tc.held, tc.freed)
			}
		})
	}
}

func TestAdvance(t *testing.T) {
	t.Parallel()
	runs := [][]outbox.Message{msgs("a:3", "a:5"), nil, msgs("b:4"), msgs("c:6", "c:7")}
	cases := []struct {
		name         string
		held, dead   map[string]bool
		wantNext     [][]outbox.ID
		wantReleased []outbox.ID
		wantFreed    bool
	}{
		{"nothing held: spent runs dropped", nil, nil, [][]outbox.ID{{3, 5}, {4}, {6, 7}}, nil, false},
		{"held key released, retried", map[string]bool{"a": true}, nil, [][]outbox.ID{{4}, {6, 7}}, []outbox.ID{3, 5}, false},
		{"held key dead-lettered frees it", map[string]bool{"a": true, "c": true}, map[string]bool{"c": true},
			[][]outbox.ID{{4}}, []outbox.ID{3, 5, 6, 7}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			next, released, freed := advance(runs, tc.held, tc.dead)
			if got := runIDLists(next); !reflect.DeepEqual(got, tc.wantNext) {
				t.Errorf("next = %v, want %v", got, tc.wantNext)
			}
			if !reflect.DeepEqual(released, tc.wantReleased) || freed != tc.wantFreed {
				t.Errorf("released, freed = %v, %v, want %v, %v", released, freed, tc.wantReleased, tc.wantFreed)
			}
		})
	}
}

func TestCountDeferred(t *testing.T) {
	t.Parallel()
	first := &publish.DeferError{Reason: publish.DeferDeployment}
	var st Stats
	st.countDeferred([]*publish.DeferError{first, {Reason: publish.DeferQuota}, {Reason: publish.DeferQuota}, {Reason: publish.DeferOutage}})
	if st.DeferredDeployment != 1 || st.DeferredQuota != 2 || st.DeferredOutage != 1 || st.deferred != first {
		t.Errorf("stats = %+v, want 1 deployment, 2 quota, 1 outage, the first kept", st)
	}
}

// TestPublishBatch runs the whole batch decision over a scripted publisher: which messages
// each call carried, and what the batch's outcome statements would record.
func TestPublishBatch(t *testing.T) {
	t.Parallel()
	transient := errors.New("503")
	cases := []struct {
		name      string
		ordering  publish.Ordering
		claimed   outboxstore.Claimed
		fail      map[outbox.ID]error
		expired   bool // the publish deadline has passed before the batch starts
		calls     [][]outbox.ID
		want      marks // retries and dead compared by id only
		unblocked bool
	}{
		{name: "fifo: one wave per position of each key", ordering: publish.OrderingFIFO,
			claimed: outboxstore.Claimed{Messages: msgs("a:1", "b:2", "a:3", "a:4", "b:5")},
			calls:   [][]outbox.ID{{1, 2}, {3, 5}, {4}},
			want:    marks{published: []outbox.ID{1, 2, 3, 5, 4}}},
		{name: "fifo: a retry holds the key's later events", ordering: publish.OrderingFIFO,
			claimed: outboxstore.Claimed{Messages: msgs("a:1", "b:2", "a:3", "b:4")},
			fail:    map[outbox.ID]error{1: transient},
			calls:   [][]outbox.ID{{1, 2}, {4}},
			want:    marks{published: []outbox.ID{2, 4}, retries: []outboxstore.Retry{{ID: 1}}, released: []outbox.ID{3}}},
		{name: "fifo: a dead letter unblocks its key", ordering: publish.OrderingFIFO,
			claimed: outboxstore.Claimed{Messages: msgs("a:1", "a:2")},
			fail:    map[outbox.ID]error{1: publish.Permanent(errors.New("400"))},
			calls:   [][]outbox.ID{{1}},
			want:    marks{dead: []outboxstore.Failure{{ID: 1}}, released: []outbox.ID{2}}, unblocked: true},
		{name: "undecodable row holds its key before any call", ordering: publish.OrderingPublish,
			claimed: outboxstore.Claimed{Messages: msgs("a:1", "a:3", "b:4"), Undecodable: []outboxstore.Failure{{ID: 2, PartitionKey: "a"}}},
			calls:   [][]outbox.ID{{1, 4}},
			want:    marks{published: []outbox.ID{1, 4}, dead: []outboxstore.Failure{{ID: 2}}, released: []outbox.ID{3}}, unblocked: true},
		{name: "publish: one call, failures do not hold within it", ordering: publish.OrderingPublish,
			claimed: outboxstore.Claimed{Messages: msgs("a:1", "a:2")},
			fail:    map[outbox.ID]error{1: transient},
			calls:   [][]outbox.ID{{1, 2}},
			want:    marks{published: []outbox.ID{2}, retries: []outboxstore.Retry{{ID: 1}}}},
		{name: "a deferral stops the batch", ordering: publish.OrderingFIFO,
			claimed: outboxstore.Claimed{Messages: msgs("a:1", "b:2", "a:3")},
			fail:    map[outbox.ID]error{2: &publish.DeferError{Reason: publish.DeferQuota}},
			calls:   [][]outbox.ID{{1, 2}},
			want:    marks{published: []outbox.ID{1}, released: []outbox.ID{2, 3}}, unblocked: true},
		{name: "out of time: everything released unsent", ordering: publish.OrderingFIFO, expired: true,
			claimed: outboxstore.Claimed{Messages: msgs("a:1", "b:2")},
			want:    marks{released: []outbox.ID{1, 2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls [][]outbox.ID
			pub := PublisherFunc(func(_ context.Context, ms []outbox.Message) []publish.Result {
				calls = append(calls, ids(ms))
				res := make([]publish.Result, len(ms))
				for i, m := range ms {
					res[i].Err = tc.fail[m.ID]
				}
				return res
			})
			cfg := Config{Ordering: tc.ordering, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}.WithDefaults()
			r := &Relay{pub: pub, cfg: cfg, log: cfg.Logger}
			deadline := time.Now().Add(time.Minute)
			if tc.expired {
				deadline = time.Now().Add(-time.Second)
			}
			var st Stats
			out, unblocked := r.publishBatch(t.Context(), tc.claimed, deadline, &st)
			if !reflect.DeepEqual(calls, tc.calls) {
				t.Errorf("publish calls = %v, want %v", calls, tc.calls)
			}
			if st.PublishCalls != len(tc.calls) {
				t.Errorf("Stats.PublishCalls = %d, want %d", st.PublishCalls, len(tc.calls))
			}
			for i := range out.retries {
				out.retries[i] = outboxstore.Retry{ID: out.retries[i].ID}
			}
			for i := range out.dead {
				out.dead[i] = outboxstore.Failure{ID: out.dead[i].ID}
			}
			if !reflect.DeepEqual(out, tc.want) || unblocked != tc.unblocked {
				t.Errorf("outcome, unblocked = %+v, %v\nwant %+v, %v", out, unblocked, tc.want, tc.unblocked)
			}
		})
	}
}

// A relay without its own Ordering takes its publisher's, and one whose publisher does
// not say gets fifo waves (they keep per-key order whatever the queue does).
func TestOrderingOfThePublisher(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pub  Publisher
		want publish.Ordering
	}{
		{orderedPublisher{publish.OrderingPublish}, publish.OrderingPublish},
		{orderedPublisher{publish.OrderingFIFO}, publish.OrderingFIFO},
		{PublisherFunc(func(context.Context, []outbox.Message) []publish.Result { return nil }), publish.OrderingFIFO},
	} {
		if got := orderingOf(tc.pub); got != tc.want {
			t.Errorf("orderingOf(%T) = %q, want %q", tc.pub, got, tc.want)
		}
	}
}

type orderedPublisher struct{ o publish.Ordering }

func (p orderedPublisher) Ordering() publish.Ordering { return p.o }
func (orderedPublisher) Publish(context.Context, []outbox.Message) []publish.Result {
	return nil
}
