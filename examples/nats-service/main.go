// Command nats-service is the example of the NATS service middleware
// (package natslimit): a micro service "greeter" whose endpoint greet.hello
// admits each tenant account --limit requests per --window, counted by
// Sluice. Tenants reach it through a service import (nats.conf in this
// folder), and the server names the requesting account in each request's
// Nats-Request-Info header; a tenant over its limit is answered
// Nats-Service-Error-Code 429 with Retry-After, the other tenants are not
// touched. README.md, "NATS service middleware", runs it.
//
// With --call N it is a tenant's client instead: it sends N requests to
// greet.hello, one after another, and prints each answer.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluicehq/sluice/bus"
	"github.com/sluicehq/sluice/natslimit"
)

func main() {
	url := flag.String("nats-url", "nats://greeter:greeter-example-password@127.0.0.1:4222",
		"NATS URL, as a user of the service's account (greeter in nats.conf)")
	limit := flag.Int64("limit", 10, "requests each tenant account may send per window")
	window := flag.Duration("window", time.Minute, "window length, 1s or more")
	failClosed := flag.Bool("fail-closed", false, "refuse requests (503) while no limiter answers, instead of admitting them")
	calls := flag.Int("call", 0, "send this many requests to greet.hello as a tenant (--nats-url with a tenant's user) and print the answers, instead of serving")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var err error
	if *calls > 0 {
		err = call(*url, *calls)
	} else {
		err = run(*url, *limit, *window, *failClosed, logger)
	}
	if err != nil {
		logger.Error("nats-service", "error", err)
		os.Exit(1)
	}
}

// call sends n requests to greet.hello and prints each answer: the body,
// or the micro error code and description with Retry-After.
func call(url string, n int) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer nc.Close()
	for i := 1; i <= n; i++ {
		reply, err := nc.Request("greet.hello", nil, 2*time.Second)
		if err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		if code := reply.Header.Get(micro.ErrorCodeHeader); code != "" {
			fmt.Printf("%d: %s %s (Retry-After: %q)\n", i, code, reply.Header.Get(micro.ErrorHeader),
				reply.Header.Get(natslimit.RetryAfterHeader))
			continue
		}
		fmt.Printf("%d: %s\n", i, reply.Data)
	}
	return nil
}

func run(url string, limit int64, window time.Duration, failClosed bool, logger *slog.Logger) error {
	nc, err := nats.Connect(url, nats.Name("greeter"))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer nc.Drain()

	// The service's account is its workspace (nats.conf imports
	// ratelimit.check.greeter.> and its siblings); the namespace names
	// the endpoint.
	mw, err := natslimit.New(natslimit.Config{
		Checker:    bus.NewClient(nc),
		Workspace:  "greeter",
		Namespace:  "hello",
		Limit:      limit,
		Window:     window,
		Key:        natslimit.Account(),
		FailClosed: failClosed,
		Logger:     logger,
	})
	if err != nil {
		return err
	}
	svc, err := micro.AddService(nc, micro.Config{Name: "greeter", Version: "1.0.0"})
	if err != nil {
		return fmt.Errorf("add service: %w", err)
	}
	defer svc.Stop()
	hello := micro.HandlerFunc(func(req micro.Request) {
		info, _ := natslimit.ParseRequestInfo(nats.Header(req.Headers()))
		_ = req.Respond(fmt.Appendf(nil, "hello, %s", info.Account))
	})
	if err := svc.AddEndpoint("hello", mw.Handler(hello), micro.WithEndpointSubject("greet.hello")); err != nil {
		return fmt.Errorf("add endpoint: %w", err)
	}
	logger.Info("serving greet.hello", "limit", limit, "window", window, "fail_closed", failClosed)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	return nil
}
