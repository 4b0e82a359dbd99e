package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus/wire"
	"github.com/sluicehq/sluice/internal/envflag"
	"github.com/sluicehq/sluice/window"
)

// topMaxKeys bounds the identifiers "limiter top" tells apart; later ones
// are counted under identifier "_other" of their workspace and namespace.
const topMaxKeys = 100_000

// topKey names one limited identifier.
type topKey struct{ Workspace, Namespace, Identifier string }

// topRow is what "limiter top" counted of one identifier.
type topRow struct {
	Workspace    string `json:"workspace"`
	Namespace    string `json:"namespace"`
	Identifier   string `json:"identifier"`
	Denied       int64  `json:"denied"`
	ShadowDenied int64  `json:"shadow_denied"`
	Admitted     int64  `json:"admitted"`
	// Limit and RetryAfter are the last event's.
	Limit      int64 `json:"limit"`
	RetryAfter int64 `json:"retry_after"`
}

// topOutput is what "limiter top --json" prints each round.
type topOutput struct {
	Events    int64    `json:"events"`
	Malformed int64    `json:"malformed"`
	Top       []topRow `json:"top"`
}

// topCounts counts decision events by identifier.
type topCounts struct {
	mu        sync.Mutex
	by        map[topKey]*topRow
	events    int64
	malformed int64
}

// add counts one event's body; a body that is not a DecisionEvent is
// counted as malformed and changes nothing else.
func (c *topCounts) add(body []byte) {
	var e wire.DecisionEvent
	err := json.Unmarshal(body, &e)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || e.Workspace == "" || e.Namespace == "" || e.Identifier == "" {
		c.malformed++
		return
	}
	c.events++
	k := topKey{e.Workspace, e.Namespace, e.Identifier}
	r := c.by[k]
	if r == nil {
		if len(c.by) >= topMaxKeys {
			k.Identifier = "_other"
			r = c.by[k]
		}
		if r == nil {
			r = &topRow{Workspace: k.Workspace, Namespace: k.Namespace, Identifier: k.Identifier}
			c.by[k] = r
		}
	}
	switch e.Outcome {
	case wire.OutcomeDenied:
		r.Denied++
	case wire.OutcomeShadowDenied:
		r.ShadowDenied++
	case wire.OutcomeAdmitted:
		r.Admitted++
	}
	r.Limit, r.RetryAfter = e.Limit, e.RetryAfter
}

// top returns the n identifiers denied most (shadow denials next, then
// admissions), ties by name.
func (c *topCounts) top(n int) topOutput {
	c.mu.Lock()
	rows := make([]topRow, 0, len(c.by))
	for _, r := range c.by {
		rows = append(rows, *r)
	}
	out := topOutput{Events: c.events, Malformed: c.malformed}
	c.mu.Unlock()
	slices.SortFunc(rows, func(a, b topRow) int {
		return cmp.Or(cmp.Compare(b.Denied, a.Denied), cmp.Compare(b.ShadowDenied, a.ShadowDenied),
			cmp.Compare(b.Admitted, a.Admitted), cmp.Compare(a.Workspace, b.Workspace),
			cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Identifier, b.Identifier))
	})
	out.Top = rows[:min(n, len(rows))]
	return out
}

// runTop is "limiter top": it follows the decision events limiters
// publish (--decision-events) and prints the most-limited identifiers,
// every --interval until interrupted, or once after --for.
func runTop(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const name = "limiter top"
	var (
		cf            cliFlags
		ws, ns        string
		interval, run time.Duration
		rows          int
		useJSON       bool
	)
	fs := envflag.NewFlagSet(name, stderr)
	cf.register(fs, "NATS server the limiters publish their decision events on")
	fs.StringVar(&ws, "workspace", "", "only this workspace; empty: every one")
	fs.StringVar(&ns, "namespace", "", "only this namespace; empty: every one")
	fs.DurationVar(&interval, "interval", 2*time.Second, "how often to print the table")
	fs.DurationVar(&run, "for", 0, "print once after this long and exit; 0: print every --interval until interrupted")
	fs.IntVar(&rows, "rows", 20, "how many identifiers to print")
	fs.BoolVar(&useJSON, "json", false, "print each table as one line of JSON")
	if err := envflag.ParsePositive(fs, args, "interval", "rows"); err != nil {
		return envflag.Refuse(stderr, name, err)
	}
	for _, tok := range []string{ws, ns} {
		if tok != "" && !wire.ValidToken(tok) {
			return envflag.Refuse(stderr, name, fmt.Errorf("%q is not a workspace or namespace: want %s", tok, window.TokenRule))
		}
	}
	nc, err := cf.dial("sluice-limiter-top")
	if err != nil {
		return answer(name, nil, err, stdout, stderr)
	}
	defer nc.Close()
	c := &topCounts{by: map[topKey]*topRow{}}
	sub, err := nc.Subscribe(wire.Subjects{Prefix: cf.prefix}.Decisions(cmp.Or(ws, "*"), cmp.Or(ns, "*")), func(m *nats.Msg) { c.add(m.Data) })
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		return answer(name, nil, fmt.Errorf("subscribe: %w", err), stdout, stderr)
	}
	defer sub.Unsubscribe()
	show := func() {
		out := c.top(rows)
		if useJSON {
			answer(name, out, nil, stdout, stderr)
			return
		}
		fmt.Fprintf(stdout, "%s  %d events, %d malformed\n", time.Now().Format(time.TimeOnly), out.Events, out.Malformed)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKSPACE\tNAMESPACE\tIDENTIFIER\tDENIED\tSHADOW\tADMITTED*\tLIMIT\tRETRY AFTER")
		for _, r := range out.Top {
			fmt.Fprintf(tw, "%s\t%s\t%q\t%d\t%d\t%d\t%d\t%dms\n", r.Workspace, r.Namespace, r.Identifier, r.Denied, r.ShadowDenied, r.Admitted, r.Limit, r.RetryAfter)
		}
		tw.Flush()
		fmt.Fprintln(stdout, "(* admissions as sampled by --decision-events-admissions)")
	}
	if run > 0 {
		select {
		case <-time.After(run):
		case <-ctx.Done():
		}
		// Events already received are counted before the table is printed.
		_ = nc.FlushTimeout(time.Second)
		show()
		return 0
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			show()
		case <-ctx.Done():
			return 0
		}
	}
}
