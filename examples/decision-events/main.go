// Command decision-events copies a limiter's decision events from the
// JetStream stream SLUICE_DECISIONS (limiter --decision-events
// --decision-events-jetstream) to standard output as CSV, one row a
// decision: workspace, namespace, identifier, outcome, cost, limit,
// retry_after, region, at. It reads through a durable consumer and
// acknowledges each event once written, so a restart resumes where it
// stopped and no event is written twice while it runs; pipe the rows into
// the store of your choice (a table, a file a dashboard reads).
//
//	go run ./examples/decision-events --nats-url nats://127.0.0.1:4222 > decisions.csv
package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/bus/wire"
)

func main() {
	url := flag.String("nats-url", nats.DefaultURL, "NATS server holding the stream "+wire.DecisionStreamName)
	durable := flag.String("durable", "decision-events-csv", "name of the durable consumer (a restart resumes from it)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *url, *durable); err != nil {
		fmt.Fprintln(os.Stderr, "decision-events:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url, durable string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, wire.DecisionStreamName, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return fmt.Errorf("consumer on %s: %w", wire.DecisionStreamName, err)
	}
	out := csv.NewWriter(os.Stdout)
	defer out.Flush()
	for ctx.Err() == nil {
		batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		for m := range batch.Messages() {
			var e wire.DecisionEvent
			if err := json.Unmarshal(m.Data(), &e); err != nil {
				fmt.Fprintf(os.Stderr, "decision-events: skipping a malformed event: %v\n", err)
				_ = m.Term()
				continue
			}
			if err := out.Write([]string{e.Workspace, e.Namespace, e.Identifier, e.Outcome,
				strconv.FormatInt(e.Cost, 10), strconv.FormatInt(e.Limit, 10), strconv.FormatInt(e.RetryAfter, 10),
				e.Region, time.UnixMilli(e.At).UTC().Format(time.RFC3339Nano)}); err != nil {
				return err
			}
			out.Flush()
			if err := out.Error(); err != nil {
				return err
			}
			_ = m.Ack()
		}
		if err := batch.Error(); err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}
