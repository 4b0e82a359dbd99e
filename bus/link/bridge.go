package link

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
)

// BridgeService is the micro service name of bridges.
const BridgeService = "ratelimit-bridge"

// Version is the version a bridge reports in $SRV.INFO when NewBridge is
// given none (BridgeVersion): cmd/bridge passes the version it was built as.
// It is the same as a limiter's (transport.Version).
const Version = "0.0.0-dev"

// Bridge is a bridge's NATS side: it implements bridge.Transport and feeds
// a bridge.Bridge from its region's limiters and the other regions'
// bridges.
type Bridge struct {
	nc       *nats.Conn
	subjects wire.Subjects
	region   string
	version  string
	log      *slog.Logger
	bridge   *bridge.Bridge
	subs     subscriptions
	svc      micro.Service
	bad      atomic.Int64
	// clock is the bridge's, set by Serve; the bridge's loops may forward
	// (a heartbeat) before Serve, hence atomic. Nil: time.Now.
	clock clock
}

// BridgeOption sets an optional property of a Bridge.
type BridgeOption func(*Bridge)

// BridgeVersion sets the version the bridge's micro service reports in
// $SRV.INFO, a semantic version (Serve fails on anything else). Without it,
// or with an empty v, the bridge reports Version.
func BridgeVersion(v string) BridgeOption {
	return func(t *Bridge) {
		if v != "" {
			t.version = v
		}
	}
}

// NewBridge returns the NATS side of a bridge of region on nc; pass it as
// bridge.BridgeConfig.Transport, then call Serve with the bridge.
func NewBridge(nc *nats.Conn, subjects wire.Subjects, region string, log *slog.Logger, opts ...BridgeOption) *Bridge {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &Bridge{nc: nc, subjects: subjects, region: region, log: log, version: Version}
	for _, o := range opts {
		o(t)
	}
	return t
}

// Forward publishes this region's components to every other region's
// bridge, stamped with the bridge's clock. With none it publishes an empty
// components message: a heartbeat, which tells the other bridges the link
// works.
func (t *Bridge) Forward(_ context.Context, cs []global.Component) error {
	now, gc := t.clock.now(), t.subjects.Internal("global.gc", t.region)
	if len(cs) == 0 {
		return t.nc.PublishMsg(stamped(gc, event.AppendComponents(nil, []global.Component{}), now))
	}
	return publishChunks(t.nc, gc, cs, now, event.AppendComponents)
}

// Broadcast publishes imports to this region's limiters, stamped with the
// bridge's clock.
func (t *Bridge) Broadcast(_ context.Context, is []global.Import) error {
	return publishChunks(t.nc, t.subjects.Internal("import", t.region), is, t.clock.now(), event.AppendImports)
}

// publishChunks publishes xs to subject, eventChunkEntries a message
// encoded by enc, each stamped now.
func publishChunks[T any](nc *nats.Conn, subject string, xs []T, now int64, enc func([]byte, []T) []byte) error {
	var errs []error
	for part := range slices.Chunk(xs, eventChunkEntries) {
		errs = append(errs, nc.PublishMsg(stamped(subject, enc(nil, part), now)))
	}
	return errors.Join(errs...)
}

// Serve subscribes the bridge to its limiters' components and
// policies (queue group per region, so two bridges of a region share the
// work; each message is acknowledged once merged, so limiters know it
// arrived), to the other regions' bridges (every bridge receives
// everything) and registers the micro service "ratelimit-bridge" with the
// endpoints snapshot, policies and policy-seq and the bridge's stats.
func (t *Bridge) Serve(b *bridge.Bridge) error {
	t.bridge = b
	t.clock.set(b.Now)
	queue := "bridge-" + t.region
	regionOf := func(subject string) string { return subject[strings.LastIndexByte(subject, '.')+1:] }
	if err := t.subs.add(t.nc,
		handler{t.subjects.Internal("gc", t.region), queue, func(m *nats.Msg) {
			if cs, err := event.DecodeComponents(m.Data); t.ok(err, m) {
				b.FromLimiters(cs, sentAt(m))
			}
			ack(m)
		}},
		handler{t.subjects.Base() + ".global.gc.*", "", func(m *nats.Msg) {
			if cs, err := event.DecodeComponents(m.Data); t.ok(err, m) {
				b.FromRegions(regionOf(m.Subject), cs, sentAt(m))
			}
		}},
		handler{t.subjects.Internal("policy", t.region), queue, func(m *nats.Msg) {
			pm, err := event.DecodePolicies(m.Data)
			if t.ok(err, m) {
				err = b.FromLimiterPolicies(pm.Overrides, pm.Marks, sentAt(m))
			}
			if err != nil {
				t.policyReply(m, 400, err.Error())
				return
			}
			ack(m)
		}},
		handler{t.subjects.Base() + ".global.policy.*", "", func(m *nats.Msg) {
			if pm, err := event.DecodePolicies(m.Data); t.ok(err, m) {
				_ = b.FromRegionPolicies(regionOf(m.Subject), pm.Overrides, pm.Marks, sentAt(m))
			}
		}},
	); err != nil {
		t.Close()
		return fmt.Errorf("bridge: %w", err)
	}
	svc, err := micro.AddService(t.nc, micro.Config{
		Name:        BridgeService,
		Version:     t.version,
		Description: "Sluice bridge: carries a region's G-Counter components to other regions and MySQL",
		QueueGroup:  queue,
		Metadata:    map[string]string{"region": t.region},
		StatsHandler: func(*micro.Endpoint) any {
			st := b.Stats()
			return struct {
				bridge.BridgeStats
				Dropped int64 `json:"malformed_messages_dropped"`
			}{st, t.bad.Load()}
		},
	})
	if err != nil {
		t.Close()
		return fmt.Errorf("bridge: add micro service: %w", err)
	}
	t.svc = svc
	for _, ep := range []struct {
		name, kind string
		handle     micro.HandlerFunc
	}{
		{"snapshot", "snapshot", t.handleSnapshot},
		{"policies", "policy.snapshot", t.handlePolicySnapshot},
		{"policy-seq", "policy.seq", t.handlePolicySeq},
	} {
		if err := svc.AddEndpoint(ep.name, ep.handle, micro.WithEndpointSubject(t.subjects.Internal(ep.kind, t.region))); err != nil {
			t.Close()
			return fmt.Errorf("bridge: add %s endpoint: %w", ep.name, err)
		}
	}
	return t.nc.Flush()
}

// ok reports whether m decoded (err is nil), counting and logging it as
// dropped if not.
func (t *Bridge) ok(err error, m *nats.Msg) bool {
	return !dropped(&t.bad, t.log, err, "dropped a malformed message", "subject", m.Subject)
}

// handleSnapshot answers with every import, in chunks.
func (t *Bridge) handleSnapshot(req micro.Request) {
	is := t.bridge.Snapshot()
	n := max(1, (len(is)+eventChunkEntries-1)/eventChunkEntries) // one empty chunk when there are none
	t.replyChunks(req.Reply(), n, "snapshot reply failed", func(i int, more bool) []byte {
		part := is[i*eventChunkEntries : min((i+1)*eventChunkEntries, len(is))]
		return event.AppendSnapshotChunk(nil, event.SnapshotChunk{Imports: part, More: more})
	})
}

// replyChunks publishes the n chunks of a snapshot to reply, chunk i
// encoded by chunk (more: another follows) and stamped with the bridge's
// clock, and stops at the first that cannot be published, logging failed.
func (t *Bridge) replyChunks(reply string, n int, failed string, chunk func(i int, more bool) []byte) {
	now := t.clock.now()
	for i := range n {
		if err := t.nc.PublishMsg(stamped(reply, chunk(i, i < n-1), now)); err != nil {
			t.log.Debug(failed, "error", err)
			return
		}
	}
}

// Dropped returns how many malformed messages the bridge dropped.
func (t *Bridge) Dropped() int64 { return t.bad.Load() }

// Close unsubscribes and stops the micro service.
func (t *Bridge) Close() error {
	var err error
	if t.svc != nil {
		err = t.svc.Stop()
	}
	return errors.Join(err, t.subs.close())
}

// ForwardPolicies publishes the override entries and reset marks this
// region accepted to every other region's bridge.
func (t *Bridge) ForwardPolicies(_ context.Context, es []policy.Entry, ms []policy.Mark) error {
	return t.publishPolicies(t.subjects.Internal("global.policy", t.region), es, ms, 0)
}

// BroadcastPolicies publishes override entries and reset marks to this
// region's limiters.
func (t *Bridge) BroadcastPolicies(_ context.Context, es []policy.Entry, ms []policy.Mark, seq uint64) error {
	return t.publishPolicies(t.subjects.Internal("policy.import", t.region), es, ms, seq)
}

// publishPolicies publishes es and ms in chunks, the last carrying seq
// (0: none).
func (t *Bridge) publishPolicies(subject string, es []policy.Entry, ms []policy.Mark, seq uint64) error {
	now := t.clock.now()
	var errs []error
	chunks := policyChunks(es, ms)
	for i, part := range chunks {
		if i == len(chunks)-1 {
			part.Seq = seq
		}
		errs = append(errs, t.nc.PublishMsg(stamped(subject, event.AppendPolicies(nil, part), now)))
	}
	return errors.Join(errs...)
}

// handlePolicySeq answers a limiter's barrier with the bridge's policy
// sequence.
func (t *Bridge) handlePolicySeq(req micro.Request) {
	body := event.AppendPolicies(nil, event.Policies{Overrides: []policy.Entry{}, Seq: t.bridge.PolicySeq()})
	if err := req.Respond(body); err != nil {
		t.log.Debug("policy sequence reply failed", "error", err)
	}
}

// policyReply answers a limiter's policies message with an error.
func (t *Bridge) policyReply(m *nats.Msg, code int, msg string) {
	if m.Reply == "" {
		return
	}
	r := nats.NewMsg(m.Reply)
	r.Header.Set(micro.ErrorCodeHeader, fmt.Sprint(code))
	r.Header.Set(micro.ErrorHeader, msg)
	_ = t.nc.PublishMsg(r)
}

// handlePolicySnapshot answers with the overrides and reset marks of the
// digest parts in which the limiter differs (all of them when it sent no
// parts) in chunks, the last carrying the bridge's digest and parts, or one
// empty chunk when the limiter's digest is the bridge's.
func (t *Bridge) handlePolicySnapshot(req micro.Request) {
	seq := t.bridge.PolicySeq() // before the entries: they hold every change up to it
	ds := t.bridge.PolicyDigests()
	var es []policy.Entry
	var ms []policy.Mark
	var parts []uint64 // the bridge's, for a limiter that sent its own
	pm, err := event.DecodePolicies(req.Data())
	switch compared := err == nil && ds.Total != 0; {
	case compared && pm.Digest == ds.Total:
	case compared && len(pm.Shards) == policy.DigestShards:
		// Only the parts in which the limiter differs.
		es, ms = t.bridge.PolicySnapshotIn(ds.Differ(pm.Shards))
		parts = ds.Shards[:]
	default:
		es, ms = t.bridge.PolicySnapshot()
	}
	chunks := policyChunks(es, ms)
	if len(chunks) == 0 {
		chunks = []event.Policies{{Overrides: []policy.Entry{}}}
	}
	t.replyChunks(req.Reply(), len(chunks), "policy snapshot reply failed", func(i int, more bool) []byte {
		p := chunks[i]
		p.More = more
		if !more {
			p.Digest, p.Seq, p.Shards = ds.Total, seq, parts
		}
		return event.AppendPolicies(nil, p)
	})
}
