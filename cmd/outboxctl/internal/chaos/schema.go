package chaos

import (
	"flag"
	"fmt"

	"github.com/outbox-relay/outbox-relay/v3/pkg/publish"
)

// BindFlags registers the run's flags on fs, with o's values (after WithDefaults and
// DefaultFaults as the caller chooses) as defaults. Call ApplyFlags after fs.Parse.
func BindFlags(fs *flag.FlagSet, o *Options) *Flags {
	fl := &Flags{o: o}
	fs.IntVar(&o.Events, "events", o.Events, "events the producers commit")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of every fault stream (default: from the clock; printed in the report)")
	fs.IntVar(&o.Producers, "producers", o.Producers, "concurrent producers")
	fs.IntVar(&o.Keys, "keys", o.Keys, "partition keys (customers)")
	fs.IntVar(&o.Relays, "relays", o.Relays, "relays draining concurrently (1..16)")
	fs.IntVar(&o.BatchSize, "batch", o.BatchSize, "relay batch size")
	fs.Float64Var(&o.PoisonRate, "poison", o.PoisonRate, "share of poison events (the handler rejects them permanently); negative: none")
	fs.Float64Var(&o.RollbackRate, "rollback", o.RollbackRate, "share of extra business transactions that enqueue and roll back; negative: none")
	fs.StringVar(&fl.ordering, "ordering", string(o.Ordering), "fifo (per-key order checked) or publish")
	fs.IntVar(&o.FIFOQueues, "fifo-queues", o.FIFOQueues, "QStash FIFO queues (fifo ordering)")
	fs.IntVar(&o.MaxAttempts, "max-attempts", o.MaxAttempts, "relay retry budget per event")
	fs.IntVar(&o.QStashRetries, "qstash-retries", o.QStashRetries, "QStash delivery retries per message")
	fs.Float64Var(&o.ClockSpeed, "clock-speed", o.ClockSpeed, "the relays' clock runs this many times faster than real time")
	fs.DurationVar(&o.LeaseReal, "lease", o.LeaseReal, "relay lease in real time")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "bound of the whole run")
	fs.BoolVar(&fl.noFaults, "no-faults", false, "turn every fault off; rate flags given as well still apply")
	f := &o.Faults
	rate := func(p *float64, name, usage string) {
		fs.Func(name, fmt.Sprintf("%s (default %v)", usage, *p), func(s string) error {
			var v float64
			if _, err := fmt.Sscan(s, &v); err != nil {
				return fmt.Errorf("not a number: %q", s)
			}
			fl.set = append(fl.set, func() { *p = v })
			return nil
		})
	}
	rate(&f.CrashBeforePublish, "crash-before-publish", "per Publish call: relay dies after its claim, before publishing")
	rate(&f.CrashAfterPublish, "crash-after-publish", "per Publish call: relay publishes, then dies before marking")
	rate(&f.SlowPublish, "slow-publish", "per Publish call: publish held past the lease, then sent")
	rate(&f.Publish500, "publish-500", "per publish request: QStash answers 500")
	rate(&f.Publish429, "publish-429", "per publish request: QStash answers 429")
	rate(&f.PublishReset, "publish-reset", "per publish request: TCP connection reset before QStash sees it")
	rate(&f.PublishDropResponse, "publish-drop-response", "per publish request: accepted, response dropped")
	rate(&f.DeliveryDuplicate, "delivery-duplicate", "per successful delivery: delivered once more")
	rate(&f.DeliveryDelay, "delivery-delay", "per delivery: held up to --max-delivery-delay")
	rate(&f.Consumer500Before, "consumer-500-before", "per delivery: handler fails before its side effect")
	rate(&f.Consumer500After, "consumer-500-after", "per delivery: handler fails after its side effect (rolled back)")
	rate(&f.ConsumerAckLost, "consumer-ack-lost", "per delivery: committed, but the 200 is replaced by a 500")
	rate(&f.DBKillsPerSecond, "db-kills-per-second", "relay pools whose backends are terminated, per second")
	rate(&f.KillInFlight, "kill-in-flight", "per Publish call: arms a relay death that takes every batch it has in flight (once two are)")
	fs.DurationVar(&f.MaxDeliveryDelay, "max-delivery-delay", f.MaxDeliveryDelay, "longest injected delivery delay")
	fs.DurationVar(&f.ConsumerOutage, "consumer-outage", f.ConsumerOutage, "take the consumer down (every delivery 500) this long; 0: no outage")
	fs.DurationVar(&f.ConsumerOutageAfter, "consumer-outage-after", f.ConsumerOutageAfter, "when the consumer outage begins, from the start of the run")
	fs.BoolVar(&fl.lambda, "lambda", false, "the deployed shape: the relay function's handler behind a local Lambda service, woken by the producers' kicks and a schedule (kick faults on)")
	fs.DurationVar(&fl.shape.Backstop, "backstop", DefaultBackstop, "with --lambda: the schedule's period (the backstop of a lost kick)")
	fs.DurationVar(&fl.shape.IdleGap, "idle-gap", DefaultLambdaIdleGap, "with --lambda: the relay function's IDLE_GAP and the kickers' interval")
	fs.Float64Var(&fl.shape.PauseRate, "pause", DefaultPauseRate, "with --lambda: per transaction, a producer pauses up to twice the idle gap (relays go idle; commits need kicks); negative: never")
	rate(&f.KickNotSent, "kick-not-sent", "with --lambda, per commit: the producer dies before its kick (default with --lambda 0.05)")
	rate(&f.KickLost, "kick-lost", "with --lambda, per kick invoke: accepted (202), then lost (default with --lambda 0.2)")
	rate(&f.KickRefused, "kick-refused", "with --lambda, per invoke request: refused with 429 or 500 (default with --lambda 0.1)")
	return fl
}

// Flags holds what BindFlags cannot write into Options while parsing.
type Flags struct {
	o        *Options
	ordering string
	noFaults bool
	lambda   bool
	shape    Lambda
	set      []func()
}

// Apply finishes the options after fs.Parse: ordering, --no-faults, the deployed shape
// (with its kick faults unless --no-faults), then the rate flags in the order given.
func (fl *Flags) Apply() {
	fl.o.Ordering = publish.Ordering(fl.ordering)
	if fl.noFaults {
		fl.o.Faults = Faults{MaxDeliveryDelay: fl.o.Faults.MaxDeliveryDelay}
	}
	if fl.lambda {
		shape := fl.shape
		shape.withDefaults()
		fl.o.Lambda = &shape
		if !fl.noFaults {
			fl.o.Faults = fl.o.Faults.WithKickFaults()
		}
	}
	for _, s := range fl.set {
		s()
	}
}
