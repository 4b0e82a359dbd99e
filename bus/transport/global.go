package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// eventChunkEntries is the most entries one internal message carries, so a
// message stays well under NATS's default 1 MB payload limit.
const eventChunkEntries = 1000

// SentAtHeader is the header of every internal message that carries its
// sender's clock when it sent it, in unix milliseconds: the receiver refuses
// a message whose stamp is further from its own clock than its clock-skew
// tolerance (global.CheckSentAt).
const SentAtHeader = "Sluice-Sent-At"

// publishTimeout bounds how long a limiter waits for its bridge to
// acknowledge a publication before it sends it again later.
const publishTimeout = time.Second

// stamped returns a message to subject carrying body and the send time now.
func stamped(subject string, body []byte, now int64) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = body
	m.Header.Set(SentAtHeader, strconv.FormatInt(now, 10))
	return m
}

// sentAt returns the send time m was stamped with, or 0 when it carries none
// that parses.
func sentAt(m *nats.Msg) int64 {
	v, err := strconv.ParseInt(m.Header.Get(SentAtHeader), 10, 64)
	if err != nil || v < 0 {
		return 0
	}
	return v
}

// unixMs returns now's reading of clock, time.Now when clock is nil.
func unixMs(clock func() time.Time) int64 {
	if clock == nil {
		return time.Now().UnixMilli()
	}
	return clock().UnixMilli()
}

// BridgeService is the micro service name of bridges.
const BridgeService = "ratelimit-bridge"

// GlobalLink is a limiter's side of the global layer: it publishes the
// components and denials the service hands it to the region's bridge, and
// applies the imports the bridge broadcasts. It implements
// service.GlobalSink, and service.LocalPublisher for a shared origin: the
// region's limiters pass each other's local counts (what each admitted
// without the origin) on <prefix>.local.<region>.
type GlobalLink struct {
	nc       *nats.Conn
	subjects wire.Subjects
	region   string
	log      *slog.Logger
	sub      *nats.Subscription
	storeSub *nats.Subscription // the queue subscription storing imports; nil unless shared
	localSub *nats.Subscription // the other limiters' local counts; nil unless shared
	shared   bool
	bad      atomic.Int64
	clock    atomic.Pointer[func() time.Time] // the service's, once attached
}

// NewGlobalLink returns a link for a limiter of region on nc. Pass it as
// service.Config.Global, then call Attach with the service.
func NewGlobalLink(nc *nats.Conn, subjects wire.Subjects, region string, log *slog.Logger) *GlobalLink {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &GlobalLink{nc: nc, subjects: subjects, region: region, log: log}
}

// Publish sends components and denials to the region's bridge and waits
// until the bridge acknowledged every message (at most a second). An error
// means some may not have arrived: the service sends them again later. It
// wraps service.ErrNoReceiver when no bridge serves the region.
func (g *GlobalLink) Publish(cs []global.Component, ds []global.Denial) error {
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	now := g.now()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	// Every chunk is in flight at once, so all of them share the one
	// deadline and a lost one does not hold up the others.
	send := func(kind string, body []byte) {
		wg.Go(func() {
			_, err := g.nc.RequestMsgWithContext(ctx, stamped(g.subjects.Internal(kind, g.region), body, now))
			switch {
			case errors.Is(err, nats.ErrNoResponders):
				err = fmt.Errorf("publish %s: %w: %w", kind, service.ErrNoReceiver, err)
			case err != nil:
				err = fmt.Errorf("publish %s: %w", kind, err)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	for start := 0; start < len(cs); start += eventChunkEntries {
		send("gc", event.AppendComponents(nil, cs[start:min(start+eventChunkEntries, len(cs))]))
	}
	for start := 0; start < len(ds); start += eventChunkEntries {
		send("deny", event.AppendDenials(nil, ds[start:min(start+eventChunkEntries, len(ds))]))
	}
	wg.Wait()
	return errors.Join(errs...)
}

// PublishLocal sends one local count of this limiter to the region's
// other limiters (service.LocalPublisher), as a components message on
// <prefix>.local.<region> whose one component's Region is id. It does not
// wait: the connection sends it before whatever is published on it later,
// so before the reply to the check that raised it when that reply goes on
// the same connection (the first instance's; the others' replies follow
// within the connection's flush). A message that cannot be queued is
// logged; the count goes with this limiter's next sync all the same.
func (g *GlobalLink) PublishLocal(c window.Cell, id string, count, expireAt int64) {
	body := event.AppendComponents(nil, []global.Component{{Cell: c, Region: id, Count: count, ExpireAt: expireAt}})
	if err := g.nc.PublishMsg(stamped(g.subjects.Internal("local", g.region), body, g.now())); err != nil {
		g.log.Debug("publishing a local count failed", "error", err)
	}
}

func (g *GlobalLink) now() int64 {
	if c := g.clock.Load(); c != nil {
		return unixMs(*c)
	}
	return unixMs(nil)
}

// ShareOrigin tells the link that the service's origin is shared by the
// region's limiters (Redis): each import message is then stored in it by
// one limiter of the region, through a queue group, rather than by every
// limiter. Without it each limiter stores what it receives in its own
// origin (the right thing for an in-process origin). Call it before Attach.
func (g *GlobalLink) ShareOrigin() { g.shared = true }

// storeImportsTimeout bounds how long storing one import message in the
// origin may take.
const storeImportsTimeout = time.Second

// Attach subscribes svc to the bridge's imports, then asks the bridge for
// every current import (waiting until ctx ends at most; no bridge is not an
// error: the limiter then starts with no imports). Every import message is
// applied to the cells svc holds (service.ApplyImports) and stored in the
// origin for the cells it does not (service.StoreImports): by every limiter,
// or by one of the region's limiters once ShareOrigin was called. The
// start-up snapshot is stored in an origin of the limiter's own (a new
// process starts with an empty one); a shared origin already holds what the
// region's limiters stored as the imports came. With ShareOrigin it also
// subscribes svc to the other limiters' local counts
// (service.ApplyLocals).
func (g *GlobalLink) Attach(ctx context.Context, svc *service.Service) error {
	clock := svc.Now
	g.clock.Store(&clock)
	store := func(is []global.Import, sent int64) {
		ctx, cancel := context.WithTimeout(context.Background(), storeImportsTimeout)
		defer cancel()
		if err := svc.StoreImports(ctx, is, sent); err != nil {
			g.log.Debug("storing imports in the origin failed; a later import of the cell stores it", "error", err)
		}
	}
	decode := func(m *nats.Msg) ([]global.Import, bool) {
		is, err := event.DecodeImports(m.Data)
		if err != nil {
			g.bad.Add(1)
			g.log.Debug("dropped a malformed import", "error", err)
			return nil, false
		}
		return is, true
	}
	subject := g.subjects.Internal("import", g.region)
	sub, err := g.nc.Subscribe(subject, func(m *nats.Msg) {
		is, ok := decode(m)
		if !ok {
			return
		}
		svc.ApplyImports(is, sentAt(m))
		if !g.shared {
			store(is, sentAt(m))
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe to imports: %w", err)
	}
	g.sub = sub
	if g.shared {
		g.storeSub, err = g.nc.QueueSubscribe(subject, "import-store-"+g.region, func(m *nats.Msg) {
			// Malformed messages are counted by the subscription above.
			if is, err := event.DecodeImports(m.Data); err == nil {
				store(is, sentAt(m))
			}
		})
		if err != nil {
			_ = sub.Unsubscribe()
			return fmt.Errorf("subscribe to imports to store: %w", err)
		}
		// Every limiter keeps every other's local counts: any survivor
		// passes a dead one's to the origin.
		g.localSub, err = g.nc.Subscribe(g.subjects.Internal("local", g.region), func(m *nats.Msg) {
			cs, err := event.DecodeComponents(m.Data)
			if err != nil {
				g.bad.Add(1)
				g.log.Debug("dropped a malformed local count", "error", err)
				return
			}
			svc.ApplyLocals(cs, sentAt(m))
		})
		if err != nil {
			_ = sub.Unsubscribe()
			_ = g.storeSub.Unsubscribe()
			return fmt.Errorf("subscribe to local counts: %w", err)
		}
	}
	n, err := RequestSnapshot(ctx, g.nc, g.subjects, g.region, func(is []global.Import, sent int64) {
		svc.ApplyImports(is, sent)
		if !g.shared {
			store(is, sent)
		}
	})
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

// Dropped returns how many malformed import and local count messages the
// link dropped.
func (g *GlobalLink) Dropped() int64 { return g.bad.Load() }

// Close stops receiving imports.
func (g *GlobalLink) Close() error {
	var errs []error
	for _, sub := range []*nats.Subscription{g.sub, g.storeSub, g.localSub} {
		if sub != nil {
			errs = append(errs, sub.Unsubscribe())
		}
	}
	return errors.Join(errs...)
}

// RequestSnapshot asks the bridge of region for every current import and
// passes each chunk to apply with the time the bridge stamped it with (0:
// none); it returns how many imports arrived.
func RequestSnapshot(ctx context.Context, nc *nats.Conn, subjects wire.Subjects, region string, apply func([]global.Import, int64)) (int, error) {
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
	msg := nats.NewMsg(subjects.Internal("snapshot", region))
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
		if err := bus.ReplyError(m); err != nil {
			return n, fmt.Errorf("snapshot: %w", err)
		}
		chunk, err := event.DecodeSnapshotChunk(m.Data)
		if err != nil {
			return n, fmt.Errorf("snapshot: %w", err)
		}
		apply(chunk.Imports, sentAt(m))
		n += len(chunk.Imports)
		if !chunk.More {
			return n, nil
		}
	}
}

// BridgeTransport is a bridge's NATS side: it implements bridge.Transport
// and feeds a bridge.Bridge from its region's limiters and the other
// regions' bridges.
type BridgeTransport struct {
	nc       *nats.Conn
	subjects wire.Subjects
	region   string
	version  string
	log      *slog.Logger
	bridge   *bridge.Bridge
	subs     []*nats.Subscription
	svc      micro.Service
	bad      atomic.Int64
	// clock is the bridge's, set by Serve; the bridge's loops may forward
	// (a heartbeat) before Serve, hence atomic. Nil: time.Now.
	clock atomic.Pointer[func() time.Time]
}

// BridgeOption sets an optional property of a BridgeTransport.
type BridgeOption func(*BridgeTransport)

// BridgeVersion sets the version the bridge's micro service reports in
// $SRV.INFO, a semantic version (Serve fails on anything else). Without it,
// or with an empty v, the bridge reports Version.
func BridgeVersion(v string) BridgeOption {
	return func(t *BridgeTransport) {
		if v != "" {
			t.version = v
		}
	}
}

// NewBridgeTransport returns the transport of a bridge of region on nc; pass
// it as bridge.BridgeConfig.Transport, then call Serve with the bridge.
func NewBridgeTransport(nc *nats.Conn, subjects wire.Subjects, region string, log *slog.Logger, opts ...BridgeOption) *BridgeTransport {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &BridgeTransport{nc: nc, subjects: subjects, region: region, log: log, version: Version}
	for _, o := range opts {
		o(t)
	}
	return t
}

// now reads the bridge's clock (time.Now before Serve) in unix ms.
func (t *BridgeTransport) now() int64 {
	if c := t.clock.Load(); c != nil {
		return unixMs(*c)
	}
	return unixMs(nil)
}

// Forward publishes this region's components and denials to every other
// region's bridge, stamped with the bridge's clock. With neither it
// publishes an empty components message: a heartbeat, which tells the
// other bridges the link works.
func (t *BridgeTransport) Forward(_ context.Context, cs []global.Component, ds []global.Denial) error {
	now := t.now()
	if len(cs) == 0 && len(ds) == 0 {
		return t.nc.PublishMsg(stamped(t.subjects.Internal("global.gc", t.region), event.AppendComponents(nil, []global.Component{}), now))
	}
	var errs []error
	for start := 0; start < len(cs); start += eventChunkEntries {
		part := cs[start:min(start+eventChunkEntries, len(cs))]
		errs = append(errs, t.nc.PublishMsg(stamped(t.subjects.Internal("global.gc", t.region), event.AppendComponents(nil, part), now)))
	}
	for start := 0; start < len(ds); start += eventChunkEntries {
		part := ds[start:min(start+eventChunkEntries, len(ds))]
		errs = append(errs, t.nc.PublishMsg(stamped(t.subjects.Internal("global.deny", t.region), event.AppendDenials(nil, part), now)))
	}
	return errors.Join(errs...)
}

// Broadcast publishes imports to this region's limiters, stamped with the
// bridge's clock.
func (t *BridgeTransport) Broadcast(_ context.Context, is []global.Import) error {
	now := t.now()
	var errs []error
	for start := 0; start < len(is); start += eventChunkEntries {
		part := is[start:min(start+eventChunkEntries, len(is))]
		errs = append(errs, t.nc.PublishMsg(stamped(t.subjects.Internal("import", t.region), event.AppendImports(nil, part), now)))
	}
	return errors.Join(errs...)
}

// Serve subscribes the bridge to its limiters (queue group per region, so
// two bridges of a region share the work; each message is acknowledged
// once merged, so limiters know it arrived), to the other regions' bridges
// (every bridge receives everything) and registers the micro service
// "ratelimit-bridge" with the snapshot endpoint and the bridge's stats.
func (t *BridgeTransport) Serve(b *bridge.Bridge) error {
	t.bridge = b
	clock := b.Now
	t.clock.Store(&clock)
	queue := "bridge-" + t.region
	regionOf := func(subject string) string { return subject[strings.LastIndexByte(subject, '.')+1:] }
	handlers := []struct {
		subject, queue string
		cb             nats.MsgHandler
	}{
		{t.subjects.Internal("gc", t.region), queue, func(m *nats.Msg) {
			if cs, err := event.DecodeComponents(m.Data); t.ok(err, m) {
				b.FromLimiters(cs, nil, sentAt(m))
			}
			ack(m)
		}},
		{t.subjects.Internal("deny", t.region), queue, func(m *nats.Msg) {
			if ds, err := event.DecodeDenials(m.Data); t.ok(err, m) {
				b.FromLimiters(nil, ds, sentAt(m))
			}
			ack(m)
		}},
		{t.subjects.Base() + ".global.gc.*", "", func(m *nats.Msg) {
			if cs, err := event.DecodeComponents(m.Data); t.ok(err, m) {
				b.FromRegions(regionOf(m.Subject), cs, nil, sentAt(m))
			}
		}},
		{t.subjects.Base() + ".global.deny.*", "", func(m *nats.Msg) {
			if ds, err := event.DecodeDenials(m.Data); t.ok(err, m) {
				b.FromRegions(regionOf(m.Subject), nil, ds, sentAt(m))
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
	if err := svc.AddEndpoint("snapshot", micro.HandlerFunc(t.handleSnapshot),
		micro.WithEndpointSubject(t.subjects.Internal("snapshot", t.region))); err != nil {
		t.Close()
		return fmt.Errorf("bridge: add snapshot endpoint: %w", err)
	}
	if err := t.servePolicies(b, svc, queue, regionOf); err != nil {
		t.Close()
		return err
	}
	return t.nc.Flush()
}

// ack acknowledges a limiter's publication, when it asked for that: the
// limiter sends it again otherwise. A malformed one is acknowledged too,
// as sending it again cannot help.
func ack(m *nats.Msg) {
	if m.Reply != "" {
		_ = m.Respond(nil)
	}
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
	now := t.now()
	for start := 0; ; start += eventChunkEntries {
		part := is[start:min(start+eventChunkEntries, len(is))]
		more := start+eventChunkEntries < len(is)
		if err := t.nc.PublishMsg(stamped(reply, event.AppendSnapshotChunk(nil, event.SnapshotChunk{Imports: part, More: more}), now)); err != nil {
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
