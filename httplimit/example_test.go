package httplimit_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/httplimit"
)

// A server behind a load balancer in 10.0.0.0/8 that allows each client
// address 100 requests a minute. It compiles as README's example does; it
// needs a limiter and a NATS server to run.
func Example() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	limit, err := httplimit.New(bus.NewClient(nc),
		httplimit.Rule{Workspace: "acme", Namespace: "api", Limit: 100, Window: time.Minute},
		httplimit.WithKey(httplimit.ClientAddr(httplimit.Proxies{
			Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		})),
	)
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limit.Handler(mux)))
}

// countingChecker counts the checks that failed before handing them on.
type countingChecker struct {
	next   httplimit.Checker
	failed atomic.Int64
}

func (c *countingChecker) Check(ctx context.Context, workspace, namespace string, r bus.CheckRequest) (bus.CheckResponse, error) {
	resp, err := c.next.Check(ctx, workspace, namespace, r)
	if err != nil {
		c.failed.Add(1)
	}
	return resp, err
}

// A Checker that wraps the client, here to count failed checks, keyed by
// an API key header and failing closed.
func ExampleChecker() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	checks := &countingChecker{next: bus.NewClient(nc)}

	limit, err := httplimit.New(checks,
		httplimit.Rule{Workspace: "acme", Namespace: "paid", Limit: 10_000, Window: 24 * time.Hour},
		httplimit.WithKey(func(r *http.Request) (string, error) {
			if k := r.Header.Get("X-Api-Key"); k != "" {
				return k, nil
			}
			return "", fmt.Errorf("no X-Api-Key")
		}),
		httplimit.WithFailureMode(httplimit.FailClosed),
	)
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", limit.Handler(http.NotFoundHandler())))
}
