package chaos

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// Defaults for Options.
const (
	DefaultEvents        = 2000
	DefaultProducers     = 4
	DefaultKeys          = 64
	DefaultRelays        = 3
	DefaultBatchSize     = 50
	DefaultFIFOQueues    = 16
	DefaultPoisonRate    = 0.02
	DefaultRollbackRate  = 0.02
	DefaultClockSpeed    = 20
	DefaultLeaseReal     = 1500 * time.Millisecond
	DefaultMaxAttempts   = 40
	DefaultQStashRetries = 12
	// DefaultQStashTimeScale shrinks QStash's e^(2.5n) s retry delays: 12 s becomes
	// 0.24 ms, the one-day cap 1.7 s.
	DefaultQStashTimeScale = 2e-5
	DefaultTimeout         = 10 * time.Minute
	// DefaultSettledShare: faults stay on until production is done and this share of
	// the events is applied or dead-lettered; then they stop and the drain is timed.
	DefaultSettledShare = 0.9
)

// Faults are the injected failure rates, each a probability in [0,1] per opportunity
// (per Publish call, per publish request, per delivery, ...). A zero rate turns the fault
// off. DefaultFaults turns every one on.
type Faults struct {
	// Relay "process" faults, drawn per Publish call of a relay.
	// CrashBeforePublish: the relay dies after its claim, before publishing (rows stay
	// leased until the lease ends).
	CrashBeforePublish float64
	// CrashAfterPublish: the relay publishes, then dies before marking (QStash has the
	// messages; the rows are re-claimed and re-published after the lease, and QStash's
	// deduplication absorbs the second publish).
	CrashAfterPublish float64
	// SlowPublish: the publish is held past the lease, then sent anyway, so another relay
	// may claim and publish the same rows meanwhile; the late relay's marks are fenced.
	SlowPublish float64

	// QStash API faults, drawn per publish request.
	Publish500 float64
	Publish429 float64
	// PublishReset: the TCP connection is reset (RST) before QStash sees the request.
	PublishReset float64
	// PublishDropResponse: QStash accepts the batch, then closes the connection without
	// answering (the ambiguous case).
	PublishDropResponse float64

	// Delivery faults. DeliveryDuplicate is QStash's (per successful delivery);
	// DeliveryDelay holds a delivery up to MaxDeliveryDelay before the webhook sees it,
	// which reorders deliveries that are not in one FIFO queue.
	DeliveryDuplicate float64
	DeliveryDelay     float64
	MaxDeliveryDelay  time.Duration

	// Consumer faults, drawn per delivery. Consumer500Before fails before the side effect;
	// Consumer500After runs the side effect, then fails, so the transaction must roll
	// back; ConsumerAckLost commits, then the 200 is replaced by a 500 (the response was
	// lost), so QStash redelivers an event that is already applied.
	Consumer500Before float64
	Consumer500After  float64
	ConsumerAckLost   float64
	// ConsumerOutage, when set, takes the consumer down for this long, ConsumerOutageAfter
	// into the run: every delivery gets 500 (FaultConsumerOutage counts them). Longer than
	// QStash's ladder (QStashRetries at QStashTimeScale), it reaches the failure callback,
	// which reschedules instead of dead-lettering, and the topic's circuit (docs/
	// reliability.md, "Consumer outage"). Off in DefaultFaults.
	ConsumerOutage      time.Duration
	ConsumerOutageAfter time.Duration

	// DBKillsPerSecond: how often, on average, every backend of one relay's pool is
	// terminated (pg_terminate_backend) mid-drain.
	DBKillsPerSecond float64

	// KillInFlight: per publish (drawn on its own, apart from the crash faults), the
	// relay "process" is doomed: it dies at its first publish that finds another of its
	// batches in flight (see FaultKillInFlight).
	KillInFlight float64

	// Kick faults, in the deployed shape only (Options.Lambda; WithKickFaults sets them).
	// KickNotSent, per commit: the producer dies between its commit and its kick.
	// KickLost, per kick invoke: the Invoke API answers 202 and the event never runs (what
	// a producer that died after writing its kick's promise, before the invoke, leaves
	// too: a promise that other producers trust and no relay behind it). KickRefused, per
	// invoke request: 429 TooManyRequestsException or 500 ServiceException (the SDK
	// retries; a kick refused every time is counted failed and its promise withdrawn).
	// Whatever a lost kick leaves, the schedule's next tick must deliver.
	KickNotSent float64
	KickLost    float64
	KickRefused float64
}

// WithKickFaults returns f with the kick faults at their default rates.
func (f Faults) WithKickFaults() Faults {
	f.KickNotSent, f.KickLost, f.KickRefused = 0.05, 0.2, 0.1
	return f
}

func (f Faults) kickFaults() bool { return f.KickNotSent > 0 || f.KickLost > 0 || f.KickRefused > 0 }

// DefaultFaults has every fault on at a rate that keeps a few-thousand-event run busy
// with each kind.
func DefaultFaults() Faults {
	return Faults{
		CrashBeforePublish: 0.01, CrashAfterPublish: 0.01, SlowPublish: 0.005,
		Publish500: 0.03, Publish429: 0.02, PublishReset: 0.02, PublishDropResponse: 0.02,
		DeliveryDuplicate: 0.03, DeliveryDelay: 0.03, MaxDeliveryDelay: 20 * time.Millisecond,
		Consumer500Before: 0.02, Consumer500After: 0.02, ConsumerAckLost: 0.02,
		DBKillsPerSecond: 1, KillInFlight: 0.02,
	}
}

// Validate reports every rate outside [0,1] and the publish rates that sum past 1.
func (f Faults) Validate() error {
	var errs []error
	for name, r := range f.rates() {
		if r < 0 || r > 1 {
			errs = append(errs, fmt.Errorf("chaos faults %s: %v is not a probability in [0,1]", name, r))
		}
	}
	if s := f.Publish500 + f.Publish429 + f.PublishDropResponse; s > 1 {
		errs = append(errs, fmt.Errorf("chaos faults: Publish500+Publish429+PublishDropResponse = %v exceeds 1", s))
	}
	if s := f.CrashBeforePublish + f.CrashAfterPublish + f.SlowPublish; s > 1 {
		errs = append(errs, fmt.Errorf("chaos faults: CrashBeforePublish+CrashAfterPublish+SlowPublish = %v exceeds 1", s))
	}
	if s := f.Consumer500Before + f.Consumer500After + f.ConsumerAckLost; s > 1 {
		errs = append(errs, fmt.Errorf("chaos faults: Consumer500Before+Consumer500After+ConsumerAckLost = %v exceeds 1", s))
	}
	if s := f.KickLost + f.KickRefused; s > 1 {
		errs = append(errs, fmt.Errorf("chaos faults: KickLost+KickRefused = %v exceeds 1", s))
	}
	if f.DeliveryDelay > 0 && f.MaxDeliveryDelay <= 0 {
		errs = append(errs, errors.New("chaos faults MaxDeliveryDelay: must be positive when DeliveryDelay is set"))
	}
	if f.ConsumerOutage < 0 || f.ConsumerOutageAfter < 0 {
		errs = append(errs, fmt.Errorf("chaos faults ConsumerOutage: %v after %v: both must be non-negative", f.ConsumerOutage, f.ConsumerOutageAfter))
	}
	if f.DBKillsPerSecond < 0 {
		errs = append(errs, fmt.Errorf("chaos faults DBKillsPerSecond: %v is negative", f.DBKillsPerSecond))
	}
	return errors.Join(errs...)
}

func (f Faults) rates() map[string]float64 {
	return map[string]float64{
		"CrashBeforePublish": f.CrashBeforePublish, "CrashAfterPublish": f.CrashAfterPublish, "SlowPublish": f.SlowPublish,
		"Publish500": f.Publish500, "Publish429": f.Publish429, "PublishReset": f.PublishReset, "PublishDropResponse": f.PublishDropResponse,
		"DeliveryDuplicate": f.DeliveryDuplicate, "DeliveryDelay": f.DeliveryDelay,
		"Consumer500Before": f.Consumer500Before, "Consumer500After": f.Consumer500After, "ConsumerAckLost": f.ConsumerAckLost,
		"KillInFlight": f.KillInFlight,
		"KickNotSent":  f.KickNotSent, "KickLost": f.KickLost, "KickRefused": f.KickRefused,
	}
}

// Options configures Run. Zero fields take the Default* values, except Faults: the zero
// Faults is "no faults" (use DefaultFaults for all of them).
type Options struct {
	// DatabaseURL connects to a migrated schema of its own (search_path set), e.g.
	// pgtest.DB.URL or a postgres.CreateSchema URL. Required. The run adds the demo tables.
	DatabaseURL string
	// Events is how many events the producers commit. Default DefaultEvents.
	Events int
	// Seed seeds every fault stream. The same seed gives the same fault decisions per
	// stream; which request meets which decision depends on goroutine scheduling.
	Seed uint64
	// Producers commit business transactions concurrently. Default DefaultProducers.
	Producers int
	// Keys is the number of partition keys (customers). Default DefaultKeys.
	Keys int
	// PoisonRate is the share of events the handler rejects permanently. Default
	// DefaultPoisonRate; negative means none.
	PoisonRate float64
	// RollbackRate is the share of business transactions that enqueue an event and then
	// roll back: those events must never be delivered. Default DefaultRollbackRate;
	// negative means none.
	RollbackRate float64
	// Relays draining concurrently, 1..16. Default DefaultRelays.
	Relays    int
	BatchSize int
	// Ordering is publish.OrderingFIFO (default; per-key order is checked) or
	// publish.OrderingPublish (order is not promised and not checked).
	Ordering   publish.Ordering
	FIFOQueues int
	// ClockSpeed makes the relays' clock (relay.Config.Now) run this many times faster
	// than real time, so backoffs (1 s floor) and leases pass quickly. Default
	// DefaultClockSpeed.
	ClockSpeed float64
	// LeaseReal is the lease in real time (relay.Config.Lease is LeaseReal*ClockSpeed).
	// Default DefaultLeaseReal.
	LeaseReal time.Duration
	// MaxAttempts is the relay's retry budget; QStashRetries QStash's. See the package doc
	// for why the defaults make a non-poison dead letter practically impossible.
	MaxAttempts     int
	QStashRetries   int
	QStashTimeScale float64
	Faults          Faults
	// SettledShare: see DefaultSettledShare.
	SettledShare float64
	// Timeout bounds the whole run. Default DefaultTimeout.
	Timeout time.Duration
	// Logger receives every component's logs. Default: discarded.
	Logger *slog.Logger
	// Progress, if set, receives a line about once a second.
	Progress io.Writer
	// DayTwo injects a migration, a password rotation and a QStash outage during the run.
	DayTwo DayTwo
	// Lambda, when set, runs the relays in the deployed shape (see Lambda) instead of as
	// long-lived processes: woken by the producers' kicks and a schedule.
	Lambda *Lambda
	// OnStart, if set, is called once the stack is up, before production starts, with
	// its endpoints (e.g. to send hostile requests during a run).
	OnStart func(Endpoints)
}

// Endpoints are the running stack's addresses and credentials.
type Endpoints struct {
	WebhookBaseURL string // events go to WebhookBaseURL + "/events/<topic>"
	FailureURL     string
	QStashURL      string // the fault-injecting front of the local QStash server
	QStashToken    string
	CurrentKey     string
	NextKey        string
}

// WithDefaults returns o with zero fields set.
func (o Options) WithDefaults() Options {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Events, DefaultEvents)
	def(&o.Producers, DefaultProducers)
	def(&o.Keys, DefaultKeys)
	def(&o.Relays, DefaultRelays)
	def(&o.BatchSize, DefaultBatchSize)
	def(&o.FIFOQueues, DefaultFIFOQueues)
	def(&o.MaxAttempts, DefaultMaxAttempts)
	def(&o.QStashRetries, DefaultQStashRetries)
	if o.PoisonRate == 0 {
		o.PoisonRate = DefaultPoisonRate
	} else if o.PoisonRate < 0 {
		o.PoisonRate = 0
	}
	if o.RollbackRate == 0 {
		o.RollbackRate = DefaultRollbackRate
	} else if o.RollbackRate < 0 {
		o.RollbackRate = 0
	}
	o.Ordering = cmp.Or(o.Ordering, publish.OrderingFIFO)
	o.ClockSpeed = cmp.Or(o.ClockSpeed, DefaultClockSpeed)
	o.LeaseReal = cmp.Or(o.LeaseReal, DefaultLeaseReal)
	o.QStashTimeScale = cmp.Or(o.QStashTimeScale, DefaultQStashTimeScale)
	o.SettledShare = cmp.Or(o.SettledShare, DefaultSettledShare)
	o.Timeout = cmp.Or(o.Timeout, DefaultTimeout)
	o.Logger = cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	if o.Lambda != nil {
		l := *o.Lambda
		l.withDefaults()
		o.Lambda = &l
	}
	return o
}

// Validate reports every invalid field (after WithDefaults).
func (o Options) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("chaos options %s: "+format, append([]any{field}, args...)...))
	}
	if o.DatabaseURL == "" {
		bad("DatabaseURL", "is empty")
	}
	errs = append(errs, o.DayTwo.validate()...)
	if o.Events < 1 {
		bad("Events", "%d must be at least 1", o.Events)
	}
	if o.Producers < 1 || o.Producers > 64 {
		bad("Producers", "%d is outside 1..64", o.Producers)
	}
	if o.Keys < 1 {
		bad("Keys", "%d must be at least 1", o.Keys)
	}
	if o.Relays < 1 || o.Relays > 16 {
		bad("Relays", "%d is outside 1..16", o.Relays)
	}
	if o.PoisonRate > 1 {
		bad("PoisonRate", "%v is above 1", o.PoisonRate)
	}
	if o.RollbackRate > 1 {
		bad("RollbackRate", "%v is above 1", o.RollbackRate)
	}
	if o.Ordering != publish.OrderingFIFO && o.Ordering != publish.OrderingPublish {
		bad("Ordering", "%q is neither fifo nor publish", o.Ordering)
	}
	if o.ClockSpeed < 1 {
		bad("ClockSpeed", "%v must be at least 1", o.ClockSpeed)
	}
	if o.LeaseReal < 100*time.Millisecond {
		bad("LeaseReal", "%v is below 100ms", o.LeaseReal)
	}
	if o.SettledShare < 0 || o.SettledShare > 1 {
		bad("SettledShare", "%v is outside 0..1", o.SettledShare)
	}
	if o.QStashRetries < 0 {
		bad("QStashRetries", "%d is negative", o.QStashRetries)
	}
	if err := o.Faults.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.Lambda != nil {
		errs = append(errs, o.Lambda.validate()...)
	} else if o.Faults.kickFaults() {
		bad("Faults", "kick faults (KickNotSent, KickLost, KickRefused) need the deployed shape (Lambda, --lambda): long-lived relays are not kicked")
	}
	return errors.Join(errs...)
}
