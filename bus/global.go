package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/service"
)

// Internal subjects, under the prefix (see docs/architecture.md):
//
//	<prefix>.gc.<region>             limiters → their bridge: components
//	<prefix>.deny.<region>           limiters → their bridge: denials
//	<prefix>.global.gc.<region>      a bridge → every other region's bridge: components
//	<prefix>.global.deny.<region>    a bridge → every other region's bridge: denials
//	<prefix>.import.<region>         a bridge → its limiters: imports
//	<prefix>.snapshot.<region>       a limiter asks its bridge for every import
func (s Subjects) internal(kind, region string) string { return s.prefix() + "." + kind + "." + region }

// eventChunkEntries is the most entries one internal message carries, so a
// message stays well under NATS's default 1 MB payload limit.
const eventChunkEntries = 1000

// BridgeService is the micro service name of bridges.
const BridgeService = "ratelimit-bridge"

// GlobalLink is a limiter's side of the global layer: it publishes the
// components and denials the service hands it to the region's bridge, and
// applies the imports the bridge broadcasts. It implements
// service.GlobalSink.
type GlobalLink struct {
	nc       *nats.Conn
	subjects Subjects
	region   string
	log      *slog.Logger
	sub      *nats.Subscription
	bad      atomic.Int64
}

// NewGlobalLink returns a link for a limiter of region on nc. Pass it as
// service.Config.Global, then call Attach with the service.
func NewGlobalLink(nc *nats.Conn, subjects Subjects, region string, log *slog.Logger) *GlobalLink {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &GlobalLink{nc: nc, subjects: subjects, region: region, log: log}
}

// Publish sends components and denials to the region's bridge. A publish
// error (a closed connection) is logged; the next growth publishes again.
func (g *GlobalLink) Publish(cs []global.Component, ds []global.Denial) {
	for start := 0; start < len(cs); start += eventChunkEntries {
		part := cs[start:min(start+eventChunkEntries, len(cs))]
		if err := g.nc.Publish(g.subjects.internal("gc", g.region), AppendComponents(nil, part)); err != nil {
			g.log.Debug("publish components failed", "error", err)
		}
	}
	for start := 0; start < len(ds); start += eventChunkEntries {
		part := ds[start:min(start+eventChunkEntries, len(ds))]
		if err := g.nc.Publish(g.subjects.internal("deny", g.region), AppendDenials(nil, part)); err != nil {
			g.log.Debug("publish denials failed", "error", err)
		}
	}
}

// Attach subscribes svc to the bridge's imports, then asks the bridge for
// every current import (waiting until ctx ends at most; no bridge is not an
// error: the limiter then starts with no imports).
func (g *GlobalLink) Attach(ctx context.Context, svc *service.Service) error {
	sub, err := g.nc.Subscribe(g.subjects.internal("import", g.region), func(m *nats.Msg) {
		is, err := DecodeImports(m.Data)
		if err != nil {
			g.bad.Add(1)
			g.log.Debug("dropped a malformed import", "error", err)
			return
		}
		svc.ApplyImports(is)
	})
	if err != nil {
		return fmt.Errorf("subscribe to imports: %w", err)
	}
	g.sub = sub
	n, err := RequestSnapshot(ctx, g.nc, g.subjects, g.region, svc.ApplyImports)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		g.log.Info("no bridge in this region yet: starting without imports", "region", g.region)
	case err != nil:
		g.log.Warn("start-up snapshot failed: starting with what arrives", "error", err)
	default:
		g.log.Info("applied the bridge's snapshot", "imports", n)
	}
	return nil
}

// Dropped returns how many malformed import messages the link dropped.
func (g *GlobalLink) Dropped() int64 { return g.bad.Load() }

// Close stops receiving imports.
func (g *GlobalLink) Close() error {
	if g.sub == nil {
		return nil
	}
	return g.sub.Unsubscribe()
}

// RequestSnapshot asks the bridge of region for every current import and
// passes each chunk to apply; it returns how many imports arrived.
func RequestSnapshot(ctx context.Context, nc *nats.Conn, subjects Subjects, region string, apply func([]global.Import)) (int, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	defer sub.Unsubscribe()
	msg := nats.NewMsg(subjects.internal("snapshot", region))
	msg.Reply = inbox
	if err := nc.PublishMsg(msg); err != nil {
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	n := 0
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return n, fmt.Errorf("snapshot: %w", err)
		}
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			return n, nats.ErrNoResponders
		}
		if err := ReplyError(m); err != nil {
			return n, fmt.Errorf("snapshot: %w", err)
		}
		chunk, err := DecodeSnapshotChunk(m.Data)
		if err != nil {
			return n, fmt.Errorf("snapshot: %w", err)
		}
		apply(chunk.Imports)
		n += len(chunk.Imports)
		if !chunk.More {
			return n, nil
		}
	}
}

// BridgeTransport is a bridge's NATS side: it implements global.Transport
// and feeds a global.Bridge from its region's limiters and the other
// regions' bridges.
type BridgeTransport struct {
	nc       *nats.Conn
	subjects Subjects
	region   string
	log      *slog.Logger
	bridge   *global.Bridge
	subs     []*nats.Subscription
	svc      micro.Service
	bad      atomic.Int64
}

// NewBridgeTransport returns the transport of a bridge of region on nc; pass
// it as global.BridgeConfig.Transport, then call Serve with the bridge.
func NewBridgeTransport(nc *nats.Conn, subjects Subjects, region string, log *slog.Logger) *BridgeTransport {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &BridgeTransport{nc: nc, subjects: subjects, region: region, log: log}
}

// Forward publishes this region's components and denials to every other
// region's bridge.
func (t *BridgeTransport) Forward(_ context.Context, cs []global.Component, ds []global.Denial) error {
	var errs []error
	for start := 0; start < len(cs); start += eventChunkEntries {
		part := cs[start:min(start+eventChunkEntries, len(cs))]
		errs = append(errs, t.nc.Publish(t.subjects.internal("global.gc", t.region), AppendComponents(nil, part)))
	}
	for start := 0; start < len(ds); start += eventChunkEntries {
		part := ds[start:min(start+eventChunkEntries, len(ds))]
		errs = append(errs, t.nc.Publish(t.subjects.internal("global.deny", t.region), AppendDenials(nil, part)))
	}
	return errors.Join(errs...)
}

// Broadcast publishes imports to this region's limiters.
func (t *BridgeTransport) Broadcast(_ context.Context, is []global.Import) error {
	var errs []error
	for start := 0; start < len(is); start += eventChunkEntries {
		part := is[start:min(start+eventChunkEntries, len(is))]
		errs = append(errs, t.nc.Publish(t.subjects.internal("import", t.region), AppendImports(nil, part)))
	}
	return errors.Join(errs...)
}

// Serve subscribes the bridge to its limiters (queue group per region, so
// two bridges of a region share the work), to the other regions' bridges
// (every bridge receives everything) and registers the micro service
// "ratelimit-bridge" with the snapshot endpoint and the bridge's stats.
func (t *BridgeTransport) Serve(b *global.Bridge) error {
	t.bridge = b
	queue := "bridge-" + t.region
	handlers := []struct {
		subject, queue string
		cb             nats.MsgHandler
	}{
		{t.subjects.internal("gc", t.region), queue, func(m *nats.Msg) {
			if cs, err := DecodeComponents(m.Data); t.ok(err, m) {
				b.FromLimiters(cs, nil)
			}
		}},
		{t.subjects.internal("deny", t.region), queue, func(m *nats.Msg) {
			if ds, err := DecodeDenials(m.Data); t.ok(err, m) {
				b.FromLimiters(nil, ds)
			}
		}},
		{t.subjects.prefix() + ".global.gc.*", "", func(m *nats.Msg) {
			if cs, err := DecodeComponents(m.Data); t.ok(err, m) {
				b.FromRegions(cs, nil)
			}
		}},
		{t.subjects.prefix() + ".global.deny.*", "", func(m *nats.Msg) {
			if ds, err := DecodeDenials(m.Data); t.ok(err, m) {
				b.FromRegions(nil, ds)
			}
		}},
	}
	for _, h := range handlers {
		var sub *nats.Subscription
		var err error
		if h.queue != "" {
			sub, err = t.nc.QueueSubscribe(h.subject, h.queue, h.cb)
		} else {
			sub, err = t.nc.Subscribe(h.subject, h.cb)
		}
		if err != nil {
			t.Close()
			return fmt.Errorf("bridge: subscribe %s: %w", h.subject, err)
		}
		t.subs = append(t.subs, sub)
	}
	svc, err := micro.AddService(t.nc, micro.Config{
		Name:        BridgeService,
		Version:     Version,
		Description: "Sluice bridge: carries a region's G-Counter components to other regions and MySQL",
		QueueGroup:  queue,
		Metadata:    map[string]string{"region": t.region},
		StatsHandler: func(*micro.Endpoint) any {
			st := b.Stats()
			return struct {
				global.BridgeStats
				Dropped int64 `json:"malformed_messages_dropped"`
			}{st, t.bad.Load()}
		},
	})
	if err != nil {
		t.Close()
		return fmt.Errorf("bridge: add micro service: %w", err)
	}
	t.svc = svc
	if err := svc.AddEndpoint("snapshot", micro.HandlerFunc(t.handleSnapshot),
		micro.WithEndpointSubject(t.subjects.internal("snapshot", t.region))); err != nil {
		t.Close()
		return fmt.Errorf("bridge: add snapshot endpoint: %w", err)
	}
	return t.nc.Flush()
}

func (t *BridgeTransport) ok(err error, m *nats.Msg) bool {
	if err != nil {
		t.bad.Add(1)
		t.log.Debug("dropped a malformed message", "subject", m.Subject, "error", err)
		return false
	}
	return true
}

// handleSnapshot answers with every import, in chunks.
func (t *BridgeTransport) handleSnapshot(req micro.Request) {
	is := t.bridge.Snapshot()
	reply := req.Reply()
	for start := 0; ; start += eventChunkEntries {
		part := is[start:min(start+eventChunkEntries, len(is))]
		more := start+eventChunkEntries < len(is)
		if err := t.nc.Publish(reply, AppendSnapshotChunk(nil, SnapshotChunk{Imports: part, More: more})); err != nil {
			t.log.Debug("snapshot reply failed", "error", err)
			return
		}
		if !more {
			return
		}
	}
}

// Dropped returns how many malformed messages the bridge dropped.
func (t *BridgeTransport) Dropped() int64 { return t.bad.Load() }

// Close unsubscribes and stops the micro service.
func (t *BridgeTransport) Close() error {
	var errs []error
	if t.svc != nil {
		errs = append(errs, t.svc.Stop())
	}
	for _, s := range t.subs {
		errs = append(errs, s.Unsubscribe())
	}
	return errors.Join(errs...)
}
