package kick_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/kick"
	"github.com/outbox-relay/outbox-relay/v3/pkg/postgres/pgtest"
)

// TestKickSkipsWhileARelayPromises: a draining relay's promise (outbox_relay_awake) spares
// the invoke, and the kicks after it until the promise ends without asking again; once it
// has ended the next kick is sent.
func TestKickSkipsWhileARelayPromises(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newInvokeAPI(t, nil)
	k, _ := newKicker(t, api, kick.Config{DB: db.Pool})
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO outbox_relay_awake (token, until) VALUES (gen_random_uuid(), clock_timestamp() + interval '800 milliseconds')`); err != nil {
		t.Fatal(err)
	}
	k.Kick()
	testwait.Eventually(t, 10*time.Second, func() bool { return k.Stats().Promised == 1 }, "the promise read")
	for range 5 {
		k.Kick()
	}
	if st := k.Stats(); st.Sent != 0 || st.Promised != 1 || st.Skipped != 6 {
		t.Fatalf("stats %+v, want every kick spared by one reading of the promise", st)
	}
	time.Sleep(time.Second) // the promise ends
	k.Kick()
	testwait.Eventually(t, 10*time.Second, func() bool { return k.Stats().Sent == 1 }, "the kick after the promise ended")
	if n := len(api.got()); n != 1 {
		t.Fatalf("%d invokes, want 1", n)
	}
}

// TestKickersSendOneInvokeBetweenThem: producers that commit in the same instant, each
// with its own Kicker (its own process), send one invoke: the first writes the kick's
// promise and the others read it.
func TestKickersSendOneInvokeBetweenThem(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	api := newInvokeAPI(t, nil)
	var kickers []*kick.Kicker
	for range 6 {
		k, _ := newKicker(t, api, kick.Config{DB: db.Pool})
		kickers = append(kickers, k)
	}
	var wg sync.WaitGroup
	for _, k := range kickers {
		wg.Go(k.Kick)
	}
	wg.Wait()
	testwait.Eventually(t, 10*time.Second, func() bool {
		var done int64
		for _, k := range kickers {
			st := k.Stats()
			done += st.Sent + st.Promised + st.Failed
		}
		return done == int64(len(kickers))
	}, "every kicker to settle")
	if n := len(api.got()); n != 1 {
		t.Fatalf("%d invokes from %d kickers committing at once, want 1", n, len(kickers))
	}
}

// TestKickWithdrawsItsPromiseWhenTheInvokeFails: a refused invoke deletes the kick's
// promise, so the next producer's kick is sent, not spared for a relay nobody woke.
func TestKickWithdrawsItsPromiseWhenTheInvokeFails(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	refuse := newInvokeAPI(t, func(int) int { return 500 })
	k, _ := newKicker(t, refuse, kick.Config{DB: db.Pool})
	k.Kick()
	testwait.Eventually(t, 30*time.Second, func() bool { return k.Stats().Failed == 1 }, "the refused kick")
	var rows int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox_relay_awake`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d promises after the refused invoke (%v), want 0", rows, err)
	}
	api := newInvokeAPI(t, nil)
	other, _ := newKicker(t, api, kick.Config{DB: db.Pool})
	other.Kick()
	testwait.Eventually(t, 10*time.Second, func() bool { return other.Stats().Sent == 1 }, "the other producer's kick")
}

// TestKickWithoutTheTable: before migration 0022 every kick due is sent, and the kicker
// says once why.
func TestKickWithoutTheTable(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	if _, err := db.Pool.Exec(t.Context(), `DROP TABLE outbox_relay_awake`); err != nil {
		t.Fatal(err)
	}
	api := newInvokeAPI(t, nil)
	k, logs := newKicker(t, api, kick.Config{DB: db.Pool, Interval: 50 * time.Millisecond})
	k.Kick()
	testwait.Eventually(t, 10*time.Second, func() bool { return k.Stats().Sent == 1 }, "the first kick")
	time.Sleep(60 * time.Millisecond)
	k.Kick()
	testwait.Eventually(t, 10*time.Second, func() bool { return k.Stats().Sent == 2 }, "the second kick")
	if n := strings.Count(logs.String(), "outbox_relay_awake"); n != 1 {
		t.Fatalf("the missing table said %d times, want once:\n%s", n, logs.String())
	}
}
