package lambdasvc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/internal/testwait"
	"github.com/outbox-relay/outbox-relay/v3/pkg/kick"
	"github.com/outbox-relay/outbox-relay/v3/pkg/outbox"
)

// newKicker is a producer process's Kicker, reading the relay's promises on the outbox's
// database.
func newKicker(t *testing.T, d *deployed) *kick.Kicker {
	t.Helper()
	return newKickerOn(t, d, d.db.Pool)
}

// newKickerOn is newKicker reading promises on db; nil: a kicker that reads none (an older
// library, Config.DB unset), whose kicks only Interval spaces.
func newKickerOn(t *testing.T, d *deployed, db outbox.Querier) *kick.Kicker {
	t.Helper()
	k, err := kick.New(t.Context(), kick.Config{Function: "relay", DB: db, Client: client(d.svc.URL, 0)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close(context.Background()) })
	return k
}

// produce commits rate events a second for run, spread over the kickers' producers, each
// in a transaction of its own followed by its producer's kick.
func produce(t *testing.T, d *deployed, kickers []*kick.Kicker, rate int, run time.Duration) []outbox.ID {
	var mu sync.Mutex
	var ids []outbox.ID
	var wg sync.WaitGroup
	period := time.Duration(len(kickers)) * time.Second / time.Duration(rate)
	end := time.Now().Add(run)
	for i, k := range kickers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Producers start spread over one period, as independent processes would.
			time.Sleep(time.Duration(i) * period / time.Duration(len(kickers)))
			tick := time.NewTicker(period)
			defer tick.Stop()
			for time.Now().Before(end) {
				id := d.commit(t, k)
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
				<-tick.C
			}
		}()
	}
	wg.Wait()
	return ids
}

func waitDispatched(t *testing.T, d *deployed, n int) {
	testwait.Eventually(t, 2*time.Minute, func() bool {
		return d.db.Count(t, `SELECT count(*) FROM outbox WHERE dispatched_at IS NOT NULL`) == n
	}, "%d events dispatched", n)
}
