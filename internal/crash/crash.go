// Package crash stands in for a SIGKILL of a limiter inside one test
// process: an Origin wrapper whose calls all fail once Kill is called, so
// the limiter built on it neither reports nor gives its leases back again,
// as a killed process would not, while everything else of the test goes on.
package crash

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/sluicehq/sluice/region"
)

// ErrKilled is the error of every call after Kill.
var ErrKilled = errors.New("crash: the limiter was killed")

// Origin is a region.Origin that fails every call once killed. It is safe
// for concurrent use.
type Origin struct {
	region.Origin
	dead atomic.Bool
}

// Wrap returns o behind a kill switch.
func Wrap(o region.Origin) *Origin { return &Origin{Origin: o} }

// Kill makes every call from now on fail with ErrKilled.
func (o *Origin) Kill() { o.dead.Store(true) }

// Sync is the wrapped Sync until Kill.
func (o *Origin) Sync(ctx context.Context, reporter string, s region.Sync) (region.SyncResult, error) {
	if o.dead.Load() {
		return region.SyncResult{}, ErrKilled
	}
	return o.Origin.Sync(ctx, reporter, s)
}

// Settle is the wrapped Settle until Kill.
func (o *Origin) Settle(ctx context.Context, reporter string, ss []region.Sync) ([]region.SyncResult, error) {
	if o.dead.Load() {
		return nil, ErrKilled
	}
	return o.Origin.Settle(ctx, reporter, ss)
}

// Import is the wrapped Import until Kill.
func (o *Origin) Import(ctx context.Context, imports []region.Imported) error {
	if o.dead.Load() {
		return ErrKilled
	}
	return o.Origin.Import(ctx, imports)
}
