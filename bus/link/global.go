package link

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus/event"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// publishTimeout bounds how long a limiter waits for its bridge to
// acknowledge a publication before it sends it again later.
const publishTimeout = time.Second

// Global is a limiter's side of the global layer: it publishes the
// components the service hands it to the region's bridge, and
// applies the imports the bridge broadcasts. It implements
// service.GlobalSink, and service.LocalPublisher for a shared origin: the
// region's limiters pass each other's local counts (what each admitted
// without the origin) on <prefix>.local.<region>.
type Global struct {
	nc       *nats.Conn
	subjects wire.Subjects
	region   string
	log      *slog.Logger
	subs     subscriptions
	shared   bool
	bad      atomic.Int64
	clock    clock // the service's, once attached
}

// NewGlobal returns a link for a limiter of region on nc. Pass it as
// service.Config.Global, then call Attach with the service.
func NewGlobal(nc *nats.Conn, subjects wire.Subjects, region string, log *slog.Logger) *Global {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Global{nc: nc, subjects: subjects, region: region, log: log}
}

// Publish sends components to the region's bridge and waits
// until the bridge acknowledged every message (at most a second). An error
// means some may not have arrived: the service sends them again later. It
// wraps service.ErrNoReceiver when no bridge serves the region.
func (g *Global) Publish(cs []global.Component) error {
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	now, subject := g.clock.now(), g.subjects.Internal("gc", g.region)
	parts := slices.Collect(slices.Chunk(cs, eventChunkEntries))
	errs := make([]error, len(parts)) // chunk i's, so no lock is needed
	var wg sync.WaitGroup
	// Every chunk is in flight at once, so all of them share the one
	// deadline and a lost one does not hold up the others.
	for i, part := range parts {
		body := event.AppendComponents(nil, part)
		wg.Go(func() {
			_, err := g.nc.RequestMsgWithContext(ctx, stamped(subject, body, now))
			switch {
			case errors.Is(err, nats.ErrNoResponders):
				errs[i] = fmt.Errorf("publish gc: %w: %w", service.ErrNoReceiver, err)
			case err != nil:
				errs[i] = fmt.Errorf("publish gc: %w", err)
			}
		})
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
func (g *Global) PublishLocal(c window.Cell, id string, count, expireAt int64) {
	body := event.AppendComponents(nil, []global.Component{{Cell: c, Region: id, Count: count, ExpireAt: expireAt}})
	if err := g.nc.PublishMsg(stamped(g.subjects.Internal("local", g.region), body, g.clock.now())); err != nil {
		g.log.Debug("publishing a local count failed", "error", err)
	}
}

// ShareOrigin tells the link that the service's origin is shared by the
// region's limiters (Redis): each import message is then stored in it by
// one limiter of the region, through a queue group, rather than by every
// limiter. Without it each limiter stores what it receives in its own
// origin (the right thing for an in-process origin). Call it before Attach.
func (g *Global) ShareOrigin() { g.shared = true }

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
func (g *Global) Attach(ctx context.Context, svc *service.Service) error {
	g.clock.set(svc.Now)
	store := func(is []global.Import, sent int64) {
		ctx, cancel := context.WithTimeout(context.Background(), storeImportsTimeout)
		defer cancel()
		if err := svc.StoreImports(ctx, is, sent); err != nil {
			g.log.Debug("storing imports in the origin failed; a later import of the cell stores it", "error", err)
		}
	}
	apply := func(is []global.Import, sent int64) {
		svc.ApplyImports(is, sent)
		if !g.shared {
			store(is, sent)
		}
	}
	subject := g.subjects.Internal("import", g.region)
	hs := []handler{{subject, "", func(m *nats.Msg) {
		if is, err := event.DecodeImports(m.Data); !dropped(&g.bad, g.log, err, "dropped a malformed import") {
			apply(is, sentAt(m))
		}
	}}}
	if g.shared {
		hs = append(hs, handler{subject, "import-store-" + g.region, func(m *nats.Msg) {
			// Malformed messages are counted by the subscription above.
			if is, err := event.DecodeImports(m.Data); err == nil {
				store(is, sentAt(m))
			}
		}}, handler{g.subjects.Internal("local", g.region), "", func(m *nats.Msg) {
			// Every limiter keeps every other's local counts: any survivor
			// passes a dead one's to the origin.
			if cs, err := event.DecodeComponents(m.Data); !dropped(&g.bad, g.log, err, "dropped a malformed local count") {
				svc.ApplyLocals(cs, sentAt(m))
			}
		}})
	}
	if err := g.subs.add(g.nc, hs...); err != nil {
		_ = g.Close()
		return fmt.Errorf("link: %w", err)
	}
	n, err := RequestSnapshot(ctx, g.nc, g.subjects, g.region, apply)
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
func (g *Global) Dropped() int64 { return g.bad.Load() }

// Close stops receiving imports.
func (g *Global) Close() error {
	return g.subs.close()
}

// RequestSnapshot asks the bridge of region for every current import and
// passes each chunk to apply with the time the bridge stamped it with (0:
// none); it returns how many imports arrived.
func RequestSnapshot(ctx context.Context, nc *nats.Conn, subjects wire.Subjects, region string, apply func([]global.Import, int64)) (int, error) {
	n := 0
	err := requestChunks(ctx, nc, nats.NewMsg(subjects.Internal("snapshot", region)), "snapshot", func(m *nats.Msg) (bool, error) {
		chunk, err := event.DecodeSnapshotChunk(m.Data)
		if err != nil {
			return false, err
		}
		apply(chunk.Imports, sentAt(m))
		n += len(chunk.Imports)
		return chunk.More, nil
	})
	return n, err
}
