package test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/link"
)

// peekLimit asks region for the limit applied to id (a look: nothing is
// counted), with the request's own limit 100.
func (w *world) peekLimit(region, id string) (int64, error) {
	resp, err := w.check(region, id, 100, 300_000, 0)
	return resp.Limit, err
}

// lookEverywhere waits until every region answers a look at id (limit
// limit, five-minute windows) as want says, on 20 looks in a row (two
// limiters a region: each is asked, but for a chance of 2^-19), failing
// with what after within, and returns how long after since the slowest
// region first did.
func (w *world) lookEverywhere(id string, limit int64, what string, want func(bus.CheckResponse) bool, since time.Time, within time.Duration) time.Duration {
	w.t.Helper()
	var slowest time.Duration
	for _, r := range regions {
		var first time.Duration
		streak := 0
		for streak < 20 {
			resp, err := w.check(r, id, limit, 300_000, 0)
			if err != nil {
				w.t.Fatal(err)
			}
			if !want(resp) {
				streak, first = 0, 0
				if time.Since(since) > within {
					w.t.Fatalf("%s: %s answers %+v, want %s, %v after", r, id, resp, what, time.Since(since))
				}
				time.Sleep(2 * time.Millisecond)
				continue
			}
			if streak == 0 {
				first = time.Since(since)
			}
			streak++
		}
		slowest = max(slowest, first)
	}
	return slowest
}

// appliesEverywhere is lookEverywhere until every region applies limit to
// id (the request's own limit is 100).
func (w *world) appliesEverywhere(id string, limit int64, since time.Time, within time.Duration) time.Duration {
	w.t.Helper()
	return w.lookEverywhere(id, 100, fmt.Sprintf("limit %d", limit),
		func(r bus.CheckResponse) bool { return r.Limit == limit }, since, within)
}

// restartEverything stops every limiter and bridge gracefully, then starts
// as many again, bridges first, and waits until they all serve.
func (w *world) restartEverything() {
	w.t.Helper()
	for _, r := range regions {
		for _, l := range w.limiters[r] {
			l.stop(w.t, syscall.SIGTERM, 10*time.Second)
		}
		w.bridges[r].stop(w.t, syscall.SIGTERM, 10*time.Second)
	}
	for _, r := range regions {
		w.bridges[r] = w.startBridge(r, w.dsn)
	}
	limiters := 0
	for _, r := range regions {
		waitService(w.t, w.conns[r], link.BridgeService, 1)
		for i := range w.limiters[r] {
			w.limiters[r][i] = w.startLimiter(r)
		}
		limiters += len(w.limiters[r])
	}
	for _, r := range regions {
		waitService(w.t, w.conns[r], "ratelimit", limiters*instancesPerLimiter)
	}
}

// Overrides end to end over three regions, each with two limiters on Redis
// and a bridge on MariaDB: set in one region, they apply in all three
// within the convergence target; shadow mode never denies yet counts what
// enforcement admits; they survive a restart of every process; a delete in
// another region undoes them everywhere.
func TestOverridesApplyInEveryRegionAndSurviveRestarts(t *testing.T) {
	w := startWorld(t, false, 2)
	ctx := testContext(t)

	start := time.Now()
	if _, err := w.clients["us"].SetOverride(ctx, "acme", bus.Override{Namespace: "api", Identifier: "vip_*", Limit: 3, Duration: 300_000}); err != nil {
		t.Fatal(err)
	}
	d := w.appliesEverywhere("vip_1", 3, start, 5*time.Second)
	t.Logf("set in us: every region applies it %v after the request was sent", d)
	if d > 250*time.Millisecond {
		t.Errorf("an override took %v to reach every region, over the 250ms convergence target", d)
	}

	// Shadow mode, set in eu, used in ap: never denied, and what it
	// admitted counts once enforced.
	if _, err := w.clients["eu"].SetOverride(ctx, "acme", bus.Override{Namespace: "api", Identifier: "try_*", Limit: 2, Duration: 300_000, Shadow: true}); err != nil {
		t.Fatal(err)
	}
	w.appliesEverywhere("try_1", 2, time.Now(), 5*time.Second)
	shadowDenied := 0
	for i := range 5 {
		resp, err := w.check("ap", "try_1", 100, 300_000, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Success || resp.Limit != 2 {
			t.Fatalf("shadow check %d: %+v", i, resp)
		}
		if resp.ShadowDenied {
			shadowDenied++
		}
	}
	if shadowDenied != 3 {
		t.Fatalf("%d of 5 shadow checks said shadow_denied, want 3 (limit 2)", shadowDenied)
	}
	if _, err := w.clients["ap"].SetOverride(ctx, "acme", bus.Override{Namespace: "api", Identifier: "try_*", Limit: 2, Duration: 300_000}); err != nil {
		t.Fatal(err)
	}
	// Enforced now: in ap, whose limiters count exactly, the two that
	// shadow mode admitted are spent, and the first check is denied.
	enforced := time.Now()
	w.appliesEverywhere("try_1", 2, enforced, 5*time.Second) // the enforced entry, not the shadow one, in ap
	for {
		resp, err := w.check("ap", "try_1", 100, 300_000, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !resp.ShadowDenied {
			if resp.Success {
				t.Fatalf("enforced after shadow mode admitted 2 of 2: %+v", resp)
			}
			break
		}
		// The shadow entry still applies on this limiter: the enforced
		// one is on its way (a look above saw it on another).
		if time.Since(enforced) > 5*time.Second {
			t.Fatalf("ap still answers in shadow mode 5s after the override was enforced: %+v", resp)
		}
		time.Sleep(2 * time.Millisecond)
	}

	// Every process restarts: the overrides come back from MySQL.
	w.restartEverything()
	for _, r := range regions {
		// The first check after the restart already applies it.
		if got, err := w.peekLimit(r, "vip_2"); err != nil || got != 3 {
			t.Fatalf("%s after restarting every process: limit %d, %v; want 3", r, got, err)
		}
	}
	w.appliesEverywhere("vip_2", 3, time.Now(), time.Second)

	// Deleted in ap: the request's own limit everywhere.
	start = time.Now()
	if err := w.clients["ap"].DeleteOverride(ctx, "acme", "api", "vip_*"); err != nil {
		t.Fatal(err)
	}
	d = w.appliesEverywhere("vip_3", 100, start, 5*time.Second)
	t.Logf("deleted in ap: every region applies it %v after the request was sent", d)
	list, err := w.clients["eu"].ListOverrides(ctx, "acme", "api")
	if err != nil || len(list) != 1 || list[0].Identifier != "try_*" {
		t.Fatalf("eu lists %+v, %v; want only try_*", list, err)
	}
}
