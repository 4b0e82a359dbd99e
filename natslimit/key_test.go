package natslimit_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/natslimit"
	"github.com/sluicehq/sluice/window"
)

func info(values ...string) nats.Header {
	return nats.Header{natslimit.RequestInfoHeader: values}
}

// What nats-server writes parses; anything else is an error wrapping
// ErrBadRequestInfo (or ErrNoRequestInfo when absent), never a panic.
func TestParseRequestInfo(t *testing.T) {
	long := strings.Repeat("a", 600)
	for _, c := range []struct {
		name string
		h    nats.Header
		want natslimit.RequestInfo
		err  error
	}{
		{"account only, as without share", info(`{"acc":"acme","rtt":191125}`), natslimit.RequestInfo{Account: "acme"}, nil},
		{"shared details", info(`{"start":"2026-11-27T19:00:00Z","host":"127.0.0.1","id":7,"acc":"acme","user":"alice","name":"app","lang":"go","ver":"1.55.0","rtt":1000,"server":"n1","kind":"Client","client_type":"nats"}`),
			natslimit.RequestInfo{Account: "acme", User: "alice", Name: "app"}, nil},
		{"chained imports", info(`{"acc":"acme","svc":"gateway"}`), natslimit.RequestInfo{Account: "acme", Service: "gateway"}, nil},
		{"absent", nats.Header{}, natslimit.RequestInfo{}, natslimit.ErrNoRequestInfo},
		{"nil header", nil, natslimit.RequestInfo{}, natslimit.ErrNoRequestInfo},
		{"twice", info(`{"acc":"a"}`, `{"acc":"b"}`), natslimit.RequestInfo{}, natslimit.ErrBadRequestInfo},
		{"empty", info(``), natslimit.RequestInfo{}, natslimit.ErrBadRequestInfo},
		{"truncated", info(`{"acc":"acme"`), natslimit.RequestInfo{}, natslimit.ErrBadRequestInfo},
		{"not an object", info(`["acme"]`), natslimit.RequestInfo{}, natslimit.ErrBadRequestInfo},
		{"null", info(`null`), natslimit.RequestInfo{}, natslimit.ErrBadRequestInfo},
		{"no account", info(`{"user":"alice"}`), natslimit.RequestInfo{}, natslimit.ErrBadRequestInfo},
		{"account not a string", info(`{"acc":1}`), natslimit.RequestInfo{}, natslimit.ErrBadRequestInfo},
		{"account too long", info(`{"acc":"` + long + `"}`), natslimit.RequestInfo{}, natslimit.ErrBadRequestInfo},
		{"account and user too long", info(`{"acc":"acme","user":"` + long[:508] + `"}`), natslimit.RequestInfo{}, natslimit.ErrBadRequestInfo},
		{"longer than MaxRequestInfo", info(`{"acc":"acme","jwt":"` + strings.Repeat("x", natslimit.MaxRequestInfo) + `"}`), natslimit.RequestInfo{}, natslimit.ErrBadRequestInfo},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := natslimit.ParseRequestInfo(c.h)
			if !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, c.err)
			}
			if got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func FuzzParseRequestInfo(f *testing.F) {
	for _, s := range []string{`{"acc":"acme"}`, `{"acc":"acme","user":"alice"}`, `{"acc":`, `null`, `[]`, `{"acc":"\u0000"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := natslimit.ParseRequestInfo(info(s))
		if err != nil {
			if !errors.Is(err, natslimit.ErrBadRequestInfo) || got != (natslimit.RequestInfo{}) {
				t.Fatalf("%q: %+v, %v", s, got, err)
			}
			return
		}
		if got.Account == "" || len(got.Account) > 512 {
			t.Fatalf("%q: account %q", s, got.Account)
		}
		for _, k := range []natslimit.KeyFunc{natslimit.Account(), natslimit.User()} {
			if id, ok := k("s", info(s)); ok && (id == "" || len(id) > 512) {
				t.Fatalf("%q: key %q", s, id)
			}
		}
	})
}

func TestKeyFuncs(t *testing.T) {
	shared := info(`{"acc":"acme","user":"alice"}`)
	plain := info(`{"acc":"globex"}`)
	for _, c := range []struct {
		name    string
		key     natslimit.KeyFunc
		subject string
		h       nats.Header
		want    string // "" for no key
	}{
		{"token", natslimit.SubjectToken(1), "orders.acme.create", nil, "acme"},
		{"first token", natslimit.SubjectToken(0), "orders.acme.create", nil, "orders"},
		{"last token", natslimit.SubjectToken(-1), "orders.acme.create", nil, "create"},
		{"token past the end", natslimit.SubjectToken(3), "orders.acme.create", nil, ""},
		{"token before the start", natslimit.SubjectToken(-4), "orders.acme.create", nil, ""},
		{"header", natslimit.Header("X-Tenant"), "s", nats.Header{"X-Tenant": {"acme", "globex"}}, "acme"},
		{"header absent", natslimit.Header("X-Tenant"), "s", nats.Header{"x-tenant": {"acme"}}, ""},
		{"header empty", natslimit.Header("X-Tenant"), "s", nats.Header{"X-Tenant": {""}}, ""},
		{"account", natslimit.Account(), "s", shared, "acme"},
		{"account, bad header", natslimit.Account(), "s", info(`{`), ""},
		{"user", natslimit.User(), "s", shared, "acme/alice"},
		{"user not shared", natslimit.User(), "s", plain, ""},
		{"first of, user", natslimit.FirstOf(natslimit.User(), natslimit.Account()), "s", shared, "acme/alice"},
		{"first of, account", natslimit.FirstOf(natslimit.User(), natslimit.Account()), "s", plain, "globex"},
		{"first of, none", natslimit.FirstOf(natslimit.User(), natslimit.Account()), "s", nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := c.key(c.subject, c.h)
			if ok != (c.want != "") || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, ok, c.want)
			}
		})
	}
}

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	// New checks the config only: a client without a connection does.
	ok := natslimit.Config{Checker: bus.NewClient(nil), Workspace: "greeter", Namespace: "hello", Limit: 10, Window: time.Minute, Key: natslimit.Account()}
	if _, err := natslimit.New(ok); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(*natslimit.Config){
		"no checker":          func(c *natslimit.Config) { c.Checker = nil },
		"no key":              func(c *natslimit.Config) { c.Key = nil },
		"bad workspace":       func(c *natslimit.Config) { c.Workspace = "a.b" },
		"no namespace":        func(c *natslimit.Config) { c.Namespace = "" },
		"negative limit":      func(c *natslimit.Config) { c.Limit = -1 },
		"limit too large":     func(c *natslimit.Config) { c.Limit = 1e15 + 1 },
		"window too short":    func(c *natslimit.Config) { c.Window = 999 * time.Millisecond },
		"window not whole ms": func(c *natslimit.Config) { c.Window = time.Second + time.Microsecond },
		"window too long":     func(c *natslimit.Config) { c.Window = 367 * 24 * time.Hour },
		"window and period":   func(c *natslimit.Config) { c.Period = "month" },
		"no window or period": func(c *natslimit.Config) { c.Window = 0 },
		"bad period unit":     func(c *natslimit.Config) { c.Window, c.Period = 0, "fortnight" },
		"bad period zone":     func(c *natslimit.Config) { c.Window, c.Period = 0, "month@Mars/Olympus_Mons" },
		"negative timeout":    func(c *natslimit.Config) { c.Timeout = -time.Second },
		"long unidentified":   func(c *natslimit.Config) { c.Unidentified = strings.Repeat("u", 513) },
	} {
		c := ok
		edit(&c)
		if _, err := natslimit.New(c); err == nil {
			t.Errorf("%s: New accepted %+v", name, c)
		}
	}
}

// A config has exactly one of Window and Period, and a Period that
// window.ParseCalendar reads; the errors say what a period is, or which
// zone is unknown.
func TestNewTakesWindowOrPeriod(t *testing.T) {
	base := natslimit.Config{Checker: bus.NewClient(nil), Workspace: "greeter", Namespace: "hello", Limit: 10, Key: natslimit.Account()}
	for _, p := range []string{"month@Europe/Berlin", "day", "week@America/New_York", "minute@Asia/Kolkata"} {
		c := base
		c.Period = p
		if _, err := natslimit.New(c); err != nil {
			t.Errorf("period %q refused: %v", p, err)
		}
	}
	for _, tc := range []struct {
		name   string
		window time.Duration
		period string
		want   string // in the error
	}{
		{"both", time.Minute, "day", "both"},
		{"neither", 0, "", window.CalendarRule},
		{"bad unit", 0, "fortnight", window.CalendarRule},
		{"unit in capitals", 0, "Month", window.CalendarRule},
		{"bad zone", 0, "month@Mars/Olympus_Mons", "Mars/Olympus_Mons"},
		{"@ without a zone", 0, "day@", "no time zone"},
	} {
		c := base
		c.Window, c.Period = tc.window, tc.period
		_, err := natslimit.New(c)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "natslimit: Config.") {
			t.Errorf("%s: error %v, want one of the config containing %q", tc.name, err, tc.want)
		}
	}
}
