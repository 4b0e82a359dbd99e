package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	server "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bridge"
	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/bus/link"
	"github.com/sluicehq/sluice/bus/transport"
	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/internal/natstest"
	"github.com/sluicehq/sluice/service"
	"github.com/sluicehq/sluice/window"
)

// accountsDir holds the shipped supercluster configs with tenant accounts.
const accountsDir = "../nats/configs/accounts"

// accountWorld is the shipped account configs running as a supercluster,
// with their ports rewritten.
type accountWorld struct {
	servers   map[string]*server.Server
	passwords map[string]string // user → password, as the configs define them
}

// startAccountSupercluster boots nats/configs/accounts/{us,eu,ap}.conf on
// free ports and waits until every server has its outbound gateways.
func startAccountSupercluster(t *testing.T) *accountWorld {
	t.Helper()
	w := &accountWorld{servers: map[string]*server.Server{}, passwords: map[string]string{}}
	var files []string
	for _, r := range regions {
		files = append(files, filepath.Join(accountsDir, r+".conf"))
	}
	servers, opts, err := natstest.StartConfigs(testContext(t), files...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range servers {
			s.Shutdown()
			s.WaitForShutdown()
		}
	})
	for i, r := range regions {
		o := opts[i]
		if o.Cluster.Name != r || o.Gateway.Name != r || o.SystemAccount != "SYS" {
			t.Fatalf("%s.conf: cluster %q, gateway %q, system account %q", r, o.Cluster.Name, o.Gateway.Name, o.SystemAccount)
		}
		for _, u := range o.Users {
			w.passwords[u.Username] = u.Password
		}
		w.servers[r] = servers[i]
	}
	return w
}

// accountErrors records a connection's asynchronous errors (permission
// violations among them).
type accountErrors struct {
	mu   sync.Mutex
	errs []error
}

func (a *accountErrors) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	a.errs = append(a.errs, err)
	a.mu.Unlock()
}

func (a *accountErrors) list() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]error(nil), a.errs...)
}

// waitViolation waits until a permissions violation mentioning want
// (e.g. `Subscription to "ratelimit.check.>"`) has been reported.
func (a *accountErrors) waitViolation(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		for _, err := range a.list() {
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no permissions violation for %s; async errors: %v", want, a.list())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connectAs connects user (with its password from the configs) to region's
// server and records the connection's asynchronous errors.
func (w *accountWorld) connectAs(t *testing.T, region, user string) (*nats.Conn, *accountErrors) {
	t.Helper()
	pw, ok := w.passwords[user]
	if !ok {
		t.Fatalf("no user %q in the account configs", user)
	}
	errs := &accountErrors{}
	nc, err := nats.Connect(w.servers[region].ClientURL(), nats.UserInfo(user, pw),
		nats.MaxReconnects(0), nats.ErrorHandler(errs.handler))
	if err != nil {
		t.Fatalf("connect %s to %s: %v", user, region, err)
	}
	t.Cleanup(nc.Close)
	return nc, errs
}

// startAccountBridge runs a bridge of region (memory store) as user bridge.
func (w *accountWorld) startAccountBridge(t *testing.T, region string) (*bridge.Bridge, *accountErrors) {
	t.Helper()
	nc, errs := w.connectAs(t, region, "bridge")
	tr := link.NewBridge(nc, wire.Subjects{}, region, nil)
	b, err := bridge.NewBridge(bridge.BridgeConfig{Region: region, Store: bridge.NewMemoryStore(), Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	b.Start(context.Background())
	if err := tr.Serve(b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tr.Close()
		_ = b.Close(ctx)
	})
	return b, errs
}

// accountLimiter is an in-process limiter connected as user limiter.
type accountLimiter struct {
	nc   *nats.Conn
	svc  *service.Service
	errs *accountErrors
}

// startAccountLimiter runs a limiter of region as user limiter, wired to
// its region's bridge as cmd/limiter does.
func (w *accountWorld) startAccountLimiter(t *testing.T, region string) *accountLimiter {
	t.Helper()
	nc, errs := w.connectAs(t, region, "limiter")
	glink := link.NewGlobal(nc, wire.Subjects{}, region, nil)
	svc := service.New(service.Config{Region: region, Global: glink})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := glink.Attach(ctx, svc); err != nil {
		t.Fatal(err)
	}
	plink, err := link.NewPolicy(nc, link.PolicyConfig{Region: region, Table: svc.Policies()})
	if err != nil {
		t.Fatal(err)
	}
	if err := plink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	lim, err := transport.Serve(nc, transport.LimiterConfig{Service: svc, Region: region, PolicyLink: plink})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := lim.Shutdown(ctx); err != nil {
			t.Errorf("limiter shutdown: %v", err)
		}
		_ = plink.Close(ctx)
		_ = glink.Close()
		if err := svc.Close(ctx); err != nil {
			t.Errorf("service close: %v", err)
		}
	})
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &accountLimiter{nc: nc, svc: svc, errs: errs}
}

func accountCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// The shipped account configs as a supercluster, one limiter (in us) and a
// bridge in us and eu, all in account SLUICE: tenants are answered through
// their imports from any region and only for their own workspace, and the
// service account's users can do their part and nothing more.
func TestAccountsIsolateTenantsAcrossTheSupercluster(t *testing.T) {
	w := startAccountSupercluster(t)
	usBridge, usBridgeErrs := w.startAccountBridge(t, "us")
	euBridge, euBridgeErrs := w.startAccountBridge(t, "eu")
	lim := w.startAccountLimiter(t, "us")

	// The us bridge learns of 1500 foreign cells (as if from ap): it
	// broadcasts them on ratelimit.import.us to the limiter, and a snapshot
	// carries them in two chunks to one reply subject, which the bridge's
	// allow_responses must let through.
	now := time.Now().UnixMilli()
	var foreign []global.Component
	for i := range 1500 {
		cell := window.Cell{Workspace: "acme", Namespace: "imported", Identifier: fmt.Sprint("id-", i),
			Duration: 60_000, Sequence: window.Sequence(now, 60_000)}
		foreign = append(foreign, global.Component{Cell: cell, Region: "ap", Count: 7, ExpireAt: cell.Expiry(60_000)})
	}
	usBridge.FromRegions("ap", foreign, now)
	n, err := link.RequestSnapshot(accountCtx(t, 2*time.Second), lim.nc, wire.Subjects{}, "us", func([]global.Import, int64) {})
	if err != nil || n < len(foreign) {
		t.Fatalf("limiter's snapshot request: %d imports, %v; want at least %d", n, err, len(foreign))
	}

	acme, globex := map[string]*bus.Client{}, map[string]*bus.Client{}
	acmeNC := map[string]*nats.Conn{}
	for _, r := range regions {
		nc, _ := w.connectAs(t, r, "acme")
		acmeNC[r] = nc
		acme[r] = bus.NewClient(nc, bus.WithTimeout(time.Second))
		nc, _ = w.connectAs(t, r, "globex")
		globex[r] = bus.NewClient(nc, bus.WithTimeout(time.Second))
	}
	// The mesh is whole once every region's tenants are answered by the
	// limiter in us: cross-region queue interest has propagated.
	look := func(id string, limit int64) bus.CheckRequest {
		return bus.CheckRequest{Identifier: id, Limit: limit, Duration: 60_000, Peek: true}
	}
	for _, r := range regions {
		checkUntil(accountCtx(t, 10*time.Second), t, acme[r], "acme", "warmup", look("w", 1))
		checkUntil(accountCtx(t, 10*time.Second), t, globex[r], "globex", "warmup", look("w", 1))
	}

	// (a) A tenant is answered through its import from any region, and the
	// limiter counts it under the tenant's workspace.
	spend := func(c *bus.Client, ws string, id string) bus.CheckResponse {
		t.Helper()
		resp, err := c.Check(context.Background(), ws, "api", bus.CheckRequest{Identifier: id, Limit: 1, Duration: 60_000, Cost: 1})
		if err != nil {
			t.Fatalf("%s: %v", ws, err)
		}
		return resp
	}
	for i, r := range regions {
		id := "user-" + r
		if resp := spend(acme[r], "acme", id); !resp.Success || resp.Remaining != 0 {
			t.Fatalf("acme in %s, first check: %+v, want admitted", r, resp)
		}
		// The second check arrives from another region: same counter.
		if resp := spend(acme[regions[(i+1)%len(regions)]], "acme", id); resp.Success {
			t.Fatalf("acme, second check of %s: %+v, want denied", id, resp)
		}
	}
	// The limiter counted them under workspace "acme".
	for _, r := range regions {
		d, err := lim.svc.Check(context.Background(), service.Query{Workspace: "acme", Namespace: "api",
			Identifier: "user-" + r, Limit: 1, Duration: 60_000, Cost: 0})
		if err != nil || d.Remaining != 0 {
			t.Fatalf("the limiter's acme/api/user-%s: %+v %v, want spent", r, d, err)
		}
	}
	// Batches go through the batch import, counted under acme.
	br, err := acme["ap"].Batch(context.Background(), "acme", []bus.BatchCheck{
		{Namespace: "api", CheckRequest: bus.CheckRequest{Identifier: "user-us", Limit: 1, Duration: 60_000, Cost: 1}},
	})
	if err != nil || br.Success {
		t.Fatalf("acme batch over its spent counter: %+v, %v; want refused", br, err)
	}

	// (b) Whatever acme sends, globex's counters are untouched. acme spends
	// "victim" in every way it can name globex.
	const victim = "victim"
	body := wire.AppendCheckRequest(nil, bus.JSON, wire.CheckRequest{Identifier: victim, Limit: 1, Duration: 60_000, Cost: 1})
	batchBody := wire.AppendBatchRequest(nil, bus.JSON, wire.BatchRequest{Checks: []wire.BatchCheck{
		{Namespace: "api", CheckRequest: wire.CheckRequest{Identifier: victim, Limit: 1, Duration: 60_000, Cost: 1}}}})
	for _, r := range regions {
		for _, tc := range []struct {
			subject string
			body    []byte
		}{
			{"ratelimit.check.globex.api", body},       // another tenant's workspace
			{"ratelimit.batch.globex", batchBody},      // another tenant's batch
			{"ratelimit.check.acme.globex.api", body},  // own import, extra tokens
			{"ratelimit.batch.acme.globex", batchBody}, // own batch, extra token
			{"rl.check.globex.api", body},              // names it has no import for
			{"$SRV.PING.ratelimit", nil},               // the service's discovery
			{"ratelimit.snapshot.us", nil},             // internal subjects
			{"ratelimit.gc.us", body},
		} {
			m, err := acmeNC[r].Request(tc.subject, tc.body, 300*time.Millisecond)
			// What is observed: no responders, at once, whether the
			// subject leads nowhere in acme's account or, through acme's
			// own import, to a subject no limiter serves.
			if !errors.Is(err, nats.ErrNoResponders) {
				t.Fatalf("acme in %s, %s: %v %v, want no responders", r, tc.subject, m, err)
			}
		}
		// The Go client naming globex: no responders.
		if _, err := acme[r].Check(context.Background(), "globex", "api", bus.CheckRequest{Identifier: victim, Limit: 1, Duration: 60_000, Cost: 1}); !errors.Is(err, bus.ErrNoResponders) {
			t.Fatalf("acme in %s checking globex: %v, want no responders", r, err)
		}
		// acme's own victim counter is its own.
		spend(acme[r], "acme", victim)
	}
	for _, r := range regions {
		resp, err := globex[r].Check(context.Background(), "globex", "api", look(victim, 1))
		if err != nil || !resp.Success || resp.Remaining != 1 {
			t.Fatalf("globex in %s looking at %s: %+v %v; want its full remaining 1", r, victim, resp, err)
		}
	}
	if resp := spend(globex["eu"], "globex", victim); !resp.Success {
		t.Fatalf("globex spending %s: %+v, want admitted", victim, resp)
	}
	if resp := spend(acme["eu"], "acme", "fresh"); !resp.Success {
		t.Fatalf("acme after globex spent: %+v", resp)
	}

	// The limiter applied the imports its bridge broadcast: acme sees the
	// 7 that "ap" used.
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := acme["eu"].Check(context.Background(), "acme", "imported", look("id-0", 10))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Remaining == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("acme's imported cell: %+v, want remaining 3", resp)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// (d) The service account's users can do only their part.
	bridgeNC, bridgeErrs := w.connectAs(t, "us", "bridge")
	if _, err := bridgeNC.SubscribeSync("ratelimit.check.>"); err != nil {
		t.Fatal(err)
	}
	if _, err := bridgeNC.QueueSubscribeSync("ratelimit.check.*.*", "ratelimit"); err != nil {
		t.Fatal(err)
	}
	_ = bridgeNC.Publish("ratelimit.gc.us", nil)
	bridgeErrs.waitViolation(t, `Subscription to "ratelimit.check.>"`)
	bridgeErrs.waitViolation(t, `Subscription to "ratelimit.check.*.*" using queue "ratelimit"`)
	bridgeErrs.waitViolation(t, `Publish to "ratelimit.gc.us"`)

	spyNC, spyErrs := w.connectAs(t, "us", "limiter")
	if _, err := spyNC.SubscribeSync("ratelimit.check.*.*"); err != nil { // outside the queue group
		t.Fatal(err)
	}
	_ = spyNC.Publish("ratelimit.check.globex.api", body) // forging a check
	_ = spyNC.Publish("ratelimit.import.us", nil)         // posing as the bridge
	spyErrs.waitViolation(t, `Subscription to "ratelimit.check.*.*"`)
	spyErrs.waitViolation(t, `Publish to "ratelimit.check.globex.api"`)
	spyErrs.waitViolation(t, `Publish to "ratelimit.import.us"`)

	// Operators see the services (micro discovery across regions) and
	// nothing else.
	opsNC, opsErrs := w.connectAs(t, "ap", "ops")
	for _, subj := range []string{"$SRV.PING.ratelimit", "$SRV.INFO.ratelimit", "$SRV.STATS.ratelimit", "$SRV.PING.ratelimit-bridge", "$SRV.STATS.ratelimit-bridge"} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err := opsNC.Request(subj, nil, 250*time.Millisecond)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("ops %s: %v", subj, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	_ = opsNC.Publish("ratelimit.check.acme.api", body)
	opsErrs.waitViolation(t, `Publish to "ratelimit.check.acme.api"`)

	// The global layer works under these permissions: components from the
	// limiter reach its bridge and the other region's,
	// which broadcasts imports.
	deadline = time.Now().Add(5 * time.Second)
	for {
		us, eu := usBridge.Stats(), euBridge.Stats()
		if us.ComponentsIn > 0 && eu.ComponentsFromPeers > 0 && eu.ImportsBroadcast > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("global layer stalled: us bridge %+v, eu bridge %+v", us, eu)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The real limiter and bridges met no permission error.
	if err := lim.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for name, errs := range map[string]*accountErrors{"limiter": lim.errs, "us bridge": usBridgeErrs, "eu bridge": euBridgeErrs} {
		if l := errs.list(); len(l) > 0 {
			t.Errorf("%s: async errors %v", name, l)
		}
	}
}

// writeAccountsConfig writes a server config including a copy of the
// shipped accounts.conf with edit applied, and returns its path.
func writeAccountsConfig(t *testing.T, edit func(string) string) string {
	t.Helper()
	shared, err := os.ReadFile(filepath.Join(accountsDir, "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), []byte(edit(string(shared))), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "server.conf")
	if err := os.WriteFile(conf, []byte("listen: 127.0.0.1:-1\ninclude ./accounts.conf\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return conf
}

// loadAccountsServer processes a config file and builds (without starting) its
// server.
func loadAccountsServer(path string) error {
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return fmt.Errorf("ProcessConfigFile: %w", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("NewServer: %w", err)
	}
	s.Shutdown()
	return nil
}

func TestAccountsRefuseATenantImportingAnotherTenantsSlice(t *testing.T) {
	// The shipped accounts load as they are...
	if err := loadAccountsServer(writeAccountsConfig(t, func(s string) string { return s })); err != nil {
		t.Fatalf("unedited accounts.conf: %v", err)
	}
	// ...and not once acme imports globex's slice, or every slice.
	for _, tc := range []struct{ own, stolen string }{
		{`subject: "ratelimit.check.acme.>"`, `subject: "ratelimit.check.globex.>"`},
		{`subject: "ratelimit.batch.acme"`, `subject: "ratelimit.batch.globex"`},
		{`subject: "ratelimit.check.acme.>"`, `subject: "ratelimit.check.*.>"`},
		{`subject: "ratelimit.batch.acme"`, `subject: "ratelimit.batch.*"`},
		{`subject: "ratelimit.checks.acme"`, `subject: "ratelimit.checks.globex"`},
		{`subject: "ratelimit.checks.acme"`, `subject: "ratelimit.checks.*"`},
	} {
		conf := writeAccountsConfig(t, func(s string) string {
			if n := strings.Count(s, tc.own); n != 1 {
				t.Fatalf("accounts.conf has %d of %s, want 1", n, tc.own)
			}
			return strings.Replace(s, tc.own, tc.stolen, 1)
		})
		err := loadAccountsServer(conf)
		if err == nil {
			t.Fatalf("acme importing %s: the server loaded", tc.stolen)
		}
		// Observed: refused by ProcessConfigFile, "Error adding service
		// import ...: service import not authorized".
		if !strings.Contains(err.Error(), "ProcessConfigFile") || !strings.Contains(err.Error(), "service import not authorized") {
			t.Fatalf("acme importing %s: %v, want the config refused as not authorized", tc.stolen, err)
		}
	}
}

// A tenant may import its slice under other local subjects: the workspace
// is still the account's. acme keeps a workspace token (rl.check.acme.<ns>,
// for the Go client with WithSubjectPrefix("rl")); globex drops it
// (rl.check.<ns>, rl.batch) and the server stamps "globex" in.
func TestAccountsRenamedImportsKeepTheTenantsWorkspace(t *testing.T) {
	conf := writeAccountsConfig(t, func(s string) string {
		for old, renamed := range map[string]string{
			`{ service: { account: SLUICE, subject: "ratelimit.check.acme.>" } }`:   `{ service: { account: SLUICE, subject: "ratelimit.check.acme.>" }, to: "rl.check.acme.>" }`,
			`{ service: { account: SLUICE, subject: "ratelimit.batch.acme" } }`:     `{ service: { account: SLUICE, subject: "ratelimit.batch.acme" }, to: "rl.batch.acme" }`,
			`{ service: { account: SLUICE, subject: "ratelimit.checks.acme" } }`:    `{ service: { account: SLUICE, subject: "ratelimit.checks.acme" }, to: "rl.checks.acme" }`,
			`{ service: { account: SLUICE, subject: "ratelimit.check.globex.>" } }`: `{ service: { account: SLUICE, subject: "ratelimit.check.globex.>" }, to: "rl.check.>" }`,
			`{ service: { account: SLUICE, subject: "ratelimit.batch.globex" } }`:   `{ service: { account: SLUICE, subject: "ratelimit.batch.globex" }, to: "rl.batch" }`,
			`{ service: { account: SLUICE, subject: "ratelimit.checks.globex" } }`:  `{ service: { account: SLUICE, subject: "ratelimit.checks.globex" }, to: "rl.checks" }`,
		} {
			if strings.Count(s, old) != 1 {
				t.Fatalf("accounts.conf has %d of %s, want 1", strings.Count(s, old), old)
			}
			s = strings.Replace(s, old, renamed, 1)
		}
		return s
	})
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("server never became ready")
	}
	w := &accountWorld{servers: map[string]*server.Server{"local": s}, passwords: map[string]string{}}
	for _, u := range opts.Users {
		w.passwords[u.Username] = u.Password
	}
	lim := w.startAccountLimiter(t, "local")

	acmeNC, _ := w.connectAs(t, "local", "acme")
	acme := bus.NewClient(acmeNC, bus.WithSubjectPrefix("rl"), bus.WithTimeout(time.Second))
	req := bus.CheckRequest{Identifier: "u1", Limit: 1, Duration: 60_000, Cost: 1}
	if resp, err := acme.Check(context.Background(), "acme", "api", req); err != nil || !resp.Success {
		t.Fatalf("acme via rl.check.acme.api: %+v %v, want admitted", resp, err)
	}
	if resp, err := acme.Check(context.Background(), "acme", "api", req); err != nil || resp.Success {
		t.Fatalf("acme again: %+v %v, want denied", resp, err)
	}
	if br, err := acme.Batch(context.Background(), "acme", []bus.BatchCheck{{Namespace: "api", CheckRequest: req}}); err != nil || br.Success {
		t.Fatalf("acme batch via rl.batch.acme: %+v %v, want refused", br, err)
	}
	if _, err := acme.Check(context.Background(), "globex", "api", req); !errors.Is(err, bus.ErrNoResponders) {
		t.Fatalf("acme naming globex: %v, want no responders", err)
	}

	globexNC, _ := w.connectAs(t, "local", "globex")
	wreq, _ := req.Wire()
	body := wire.AppendCheckRequest(nil, bus.JSON, wreq)
	m, err := globexNC.Request("rl.check.api", body, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := wire.DecodeCheckResponse(bus.JSON, m.Data); err != nil || !resp.Success {
		t.Fatalf("globex via rl.check.api: %+v %v (%q), want admitted: its own counter", resp, err, m.Data)
	}
	m, err = globexNC.Request("rl.batch", wire.AppendBatchRequest(nil, bus.JSON, wire.BatchRequest{Checks: []wire.BatchCheck{{Namespace: "api", CheckRequest: wreq}}}), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if br, err := wire.DecodeBatchResponse(bus.JSON, m.Data); err != nil || br.Success {
		t.Fatalf("globex via rl.batch: %+v %v (%q), want refused: globex's u1 is spent", br, err, m.Data)
	}
	// acme's own workspace token cannot be smuggled in: rl.check.acme.api
	// from globex becomes ratelimit.check.globex.acme.api, which nobody serves.
	if _, err := globexNC.Request("rl.check.acme.api", body, 300*time.Millisecond); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("globex via rl.check.acme.api: %v, want no responders", err)
	}
	if l := lim.errs.list(); len(l) > 0 {
		t.Errorf("limiter: async errors %v", l)
	}
}

// Adding a tenant is a config reload (nats-server --signal reload), done
// twice: then the running limiter serves it, and connected tenants notice
// nothing.
func TestAccountsAddATenantByReload(t *testing.T) {
	conf := writeAccountsConfig(t, func(s string) string { return s })
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("server never became ready")
	}
	w := &accountWorld{servers: map[string]*server.Server{"local": s}, passwords: map[string]string{}}
	for _, u := range opts.Users {
		w.passwords[u.Username] = u.Password
	}
	lim := w.startAccountLimiter(t, "local")
	acmeNC, acmeErrs := w.connectAs(t, "local", "acme")
	acme := bus.NewClient(acmeNC, bus.WithTimeout(time.Second))
	req := bus.CheckRequest{Identifier: "u1", Limit: 2, Duration: 60_000, Cost: 1}
	if resp, err := acme.Check(context.Background(), "acme", "api", req); err != nil || !resp.Success {
		t.Fatalf("acme before the reload: %+v %v", resp, err)
	}

	shared := filepath.Join(filepath.Dir(conf), "accounts.conf")
	b, err := os.ReadFile(shared)
	if err != nil {
		t.Fatal(err)
	}
	// A reload that would let acme import globex's slice is refused, and
	// the server keeps serving with what it had.
	stolen := strings.Replace(string(b), `subject: "ratelimit.check.acme.>"`, `subject: "ratelimit.check.globex.>"`, 1)
	if err := os.WriteFile(shared, []byte(stolen), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), "service import not authorized") {
		t.Fatalf("reload with acme importing globex's slice: %v, want refused", err)
	}
	if resp, err := acme.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: "u1", Limit: 2, Duration: 60_000, Peek: true}); err != nil || resp.Remaining != 1 {
		t.Fatalf("acme after the refused reload: %+v %v, want its counter as before", resp, err)
	}
	const tenant = `
  initech {
    users: [
      { user: initech, password: initech-example-password }
    ]
    imports: [
      { service: { account: SLUICE, subject: "ratelimit.check.initech.>" } }
      { service: { account: SLUICE, subject: "ratelimit.batch.initech" } }
      { service: { account: SLUICE, subject: "ratelimit.checks.initech" } }
    ]
  }
`
	edited := strings.Replace(string(b), "\n  globex {", tenant+"\n  globex {", 1)
	if edited == string(b) {
		t.Fatal("accounts.conf has no globex account to insert before")
	}
	if err := os.WriteFile(shared, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	// The first reload creates the account, its user and its imports, but
	// nats-server (v2.15.2, plain config accounts) subscribes the imports
	// of an account only when the account already existed: the tenant gets
	// no responders until a second reload (or a restart).
	if err := s.Reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	w.passwords["initech"] = "initech-example-password"
	firstNC, _ := w.connectAs(t, "local", "initech")
	_, err = bus.NewClient(firstNC).Check(context.Background(), "initech", "api",
		bus.CheckRequest{Identifier: "probe", Limit: 1, Duration: 60_000, Peek: true})
	t.Logf("initech after one reload: %v", err)
	if err := s.Reload(); err != nil {
		t.Fatalf("second reload: %v", err)
	}
	initechNC, _ := w.connectAs(t, "local", "initech")
	initech := bus.NewClient(initechNC, bus.WithTimeout(time.Second))
	if resp, err := initech.Check(context.Background(), "initech", "api", req); err != nil || !resp.Success || resp.Remaining != 1 {
		t.Fatalf("initech after the reloads: %+v %v, want admitted with its own counter", resp, err)
	}
	if _, err := initech.Check(context.Background(), "acme", "api", req); !errors.Is(err, bus.ErrNoResponders) {
		t.Fatalf("initech naming acme: %v, want no responders", err)
	}
	if resp, err := acme.Check(context.Background(), "acme", "api", req); err != nil || !resp.Success || resp.Remaining != 0 {
		t.Fatalf("acme after the reloads, same connection: %+v %v, want admitted with 0 left", resp, err)
	}
	for name, errs := range map[string]*accountErrors{"limiter": lim.errs, "acme": acmeErrs} {
		if l := errs.list(); len(l) > 0 {
			t.Errorf("%s: async errors %v", name, l)
		}
	}
}

// Overrides are administered by the SLUICE account's user admin, from any
// region; a tenant cannot set one, not even in its own workspace: nothing
// exports ratelimit.admin.> to tenants, so its request finds no responders
// and the limiter's overrides stay as they were. The limiter serves the
// admin endpoints under its permissions without a violation.
func TestAccountsOnlyTheAdminUserSetsOverrides(t *testing.T) {
	w := startAccountSupercluster(t)
	lim := w.startAccountLimiter(t, "us")

	adminNC, adminErrs := w.connectAs(t, "ap", "admin")
	admin := bus.NewClient(adminNC, bus.WithTimeout(time.Second))
	acmeNC, _ := w.connectAs(t, "eu", "acme")
	acme := bus.NewClient(acmeNC, bus.WithTimeout(time.Second))
	globexNC, _ := w.connectAs(t, "eu", "globex")
	globex := bus.NewClient(globexNC, bus.WithTimeout(time.Second))

	// The mesh is whole once the admin user in ap and the tenants in eu are
	// answered by the limiter in us.
	ctx := accountCtx(t, 10*time.Second)
	for {
		list, err := admin.ListOverrides(ctx, "acme", "")
		if err == nil {
			if len(list) != 0 {
				t.Fatalf("overrides before any was set: %+v", list)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("admin's override.list never answered: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	look := bus.CheckRequest{Identifier: "w", Limit: 1, Duration: 60_000, Peek: true}
	checkUntil(accountCtx(t, 10*time.Second), t, acme, "acme", "warmup", look)
	checkUntil(accountCtx(t, 10*time.Second), t, globex, "globex", "warmup", look)

	// (a) acme tries to lift its own limits, through the Go client and raw.
	lift := bus.Override{Namespace: "api", Identifier: "*", Limit: 1_000_000, Duration: 60_000}
	if o, err := acme.SetOverride(context.Background(), "acme", lift); !errors.Is(err, bus.ErrNoResponders) {
		t.Fatalf("acme setting an override in its own workspace: %+v %v, want no responders", o, err)
	}
	if _, err := acme.ListOverrides(context.Background(), "acme", ""); !errors.Is(err, bus.ErrNoResponders) {
		t.Fatalf("acme listing its overrides: %v, want no responders", err)
	}
	body := []byte(`{"namespace":"api","identifier":"*","limit":1000000,"duration":60000}`)
	for _, subj := range []string{
		"ratelimit.admin.acme.override.set",
		"ratelimit.admin.acme.override.delete",
		"ratelimit.admin.globex.override.set",
		"ratelimit.check.acme.admin.acme.override.set", // through its check import
		"$SRV.PING.ratelimit-admin",
	} {
		if m, err := acmeNC.Request(subj, body, 300*time.Millisecond); !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("acme %s: %v %v, want no responders", subj, m, err)
		}
	}
	// Neither may SLUICE's other users: ops only discovers, the limiter
	// only serves.
	opsNC, opsErrs := w.connectAs(t, "us", "ops")
	_ = opsNC.Publish("ratelimit.admin.acme.override.set", body)
	opsErrs.waitViolation(t, `Publish to "ratelimit.admin.acme.override.set"`)
	spyNC, spyErrs := w.connectAs(t, "us", "limiter")
	_ = spyNC.Publish("ratelimit.admin.acme.override.set", body)
	if _, err := spyNC.SubscribeSync("ratelimit.admin.*.override.*"); err != nil { // outside the queue group
		t.Fatal(err)
	}
	spyErrs.waitViolation(t, `Publish to "ratelimit.admin.acme.override.set"`)
	spyErrs.waitViolation(t, `Subscription to "ratelimit.admin.*.override.*"`)
	if list, err := admin.ListOverrides(context.Background(), "acme", ""); err != nil || len(list) != 0 {
		t.Fatalf("overrides seen by admin after the attempts: %+v %v, want none", list, err)
	}
	if l := lim.svc.Policies().List("acme", ""); len(l) != 0 {
		t.Fatalf("the limiter's overrides after the attempts: %+v, want none", l)
	}
	if resp, err := acme.Check(context.Background(), "acme", "api", bus.CheckRequest{Identifier: "user_1", Limit: 5, Duration: 60_000, Peek: true}); err != nil || resp.Limit != 5 {
		t.Fatalf("acme's check after the attempts: %+v %v, want its own limit 5", resp, err)
	}

	// (b) admin sets one in acme's workspace: acme's checks get its limit,
	// globex's do not.
	want := bus.Override{Namespace: "api", Identifier: "user_*", Limit: 1, Duration: 60_000}
	if got, err := admin.SetOverride(context.Background(), "acme", want); err != nil || got != want {
		t.Fatalf("admin setting %+v: %+v %v", want, got, err)
	}
	if list, err := admin.ListOverrides(context.Background(), "acme", "api"); err != nil || len(list) != 1 || list[0] != want {
		t.Fatalf("admin's list: %+v %v, want [%+v]", list, err, want)
	}
	spend := bus.CheckRequest{Identifier: "user_2", Limit: 100, Duration: 60_000, Cost: 1}
	for i, admitted := range []bool{true, false} {
		resp, err := acme.Check(context.Background(), "acme", "api", spend)
		if err != nil || resp.Limit != 1 || resp.Success != admitted {
			t.Fatalf("acme's check %d of user_2 under the override: %+v %v, want limit 1, admitted %t", i+1, resp, err, admitted)
		}
	}
	if resp, err := globex.Check(context.Background(), "globex", "api", spend); err != nil || resp.Limit != 100 || !resp.Success {
		t.Fatalf("globex's check of user_2: %+v %v, want its own limit 100: overrides are per workspace", resp, err)
	}
	// Resets are admin's too: acme's own gets no responders, admin's
	// lets acme's next check in.
	if _, err := acme.Reset(context.Background(), "acme", "api", "user_2", 0); !errors.Is(err, bus.ErrNoResponders) {
		t.Fatalf("acme resetting its own usage: %v, want no responders", err)
	}
	if resp, err := acme.Check(context.Background(), "acme", "api", spend); err != nil || resp.Success {
		t.Fatalf("acme's check after its refused reset: %+v %v, want denied", resp, err)
	}
	if _, err := admin.Reset(context.Background(), "acme", "api", "user_2", 0); err != nil {
		t.Fatalf("admin resetting user_2: %v", err)
	}
	if resp, err := acme.Check(context.Background(), "acme", "api", spend); err != nil || !resp.Success {
		t.Fatalf("acme's check after admin's reset: %+v %v, want admitted", resp, err)
	}
	// admin administers and nothing else: a check is refused.
	_ = adminNC.Publish("ratelimit.check.acme.api", body)
	adminErrs.waitViolation(t, `Publish to "ratelimit.check.acme.api"`)
	if err := admin.DeleteOverride(context.Background(), "acme", "api", "user_*"); err != nil {
		t.Fatalf("admin deleting the override: %v", err)
	}

	if err := lim.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if l := lim.errs.list(); len(l) > 0 {
		t.Errorf("limiter: async errors %v", l)
	}
}
