// Package link carries the global layer over NATS between a region's
// limiters and its bridge, and between the regions' bridges: a limiter's
// components and local counts and its imports (Global,
// RequestSnapshot), its overrides and reset marks (Policy), and the bridge's
// side of both (Bridge, which implements bridge.Transport). Every message is
// stamped with its sender's clock (SentAtHeader) and carries at most 1,000
// entries. The limiter's doors, the endpoints clients call, are in
// bus/transport; neither package imports the other.
package link

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/bus"
)

// eventChunkEntries is the most entries one internal message carries, so a
// message stays well under NATS's default 1 MB payload limit.
const eventChunkEntries = 1000

// SentAtHeader is the header of every internal message that carries its
// sender's clock when it sent it, in unix milliseconds: the receiver refuses
// a message whose stamp is further from its own clock than its clock-skew
// tolerance (global.CheckSentAt).
const SentAtHeader = "Sluice-Sent-At"

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

// clock is the clock a link stamps with: the one set, time.Now until then.
// Atomic, as a link may stamp before its clock is set.
type clock struct {
	f atomic.Pointer[func() time.Time]
}

// set makes f the clock.
func (c *clock) set(f func() time.Time) { c.f.Store(&f) }

// now reads the clock in unix milliseconds.
func (c *clock) now() int64 {
	if f := c.f.Load(); f != nil {
		return (*f)().UnixMilli()
	}
	return time.Now().UnixMilli()
}

// ack acknowledges a limiter's publication, when it asked for that: the
// limiter sends it again otherwise. A malformed one is acknowledged too,
// as sending it again cannot help.
func ack(m *nats.Msg) {
	if m.Reply != "" {
		_ = m.Respond(nil)
	}
}

// requestChunks sends msg with an inbox of its own as reply subject and
// passes each reply to chunk until chunk says no more follow, or ctx ends
// (after 5 seconds when it has no deadline). No bridge answering is
// nats.ErrNoResponders; every other error is wrapped in what.
func requestChunks(ctx context.Context, nc *nats.Conn, msg *nats.Msg, what string, chunk func(*nats.Msg) (more bool, err error)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer sub.Unsubscribe()
	msg.Reply = inbox
	if err := nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			return nats.ErrNoResponders
		}
		err = bus.ReplyError(m)
		more := false
		if err == nil {
			more, err = chunk(m)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if !more {
			return nil
		}
	}
}

// dropped reports whether a received message failed to decode (err not
// nil); if so it counts it in bad and logs msg with args and the error.
func dropped(bad *atomic.Int64, log *slog.Logger, err error, msg string, args ...any) bool {
	if err == nil {
		return false
	}
	bad.Add(1)
	log.Debug(msg, append(args, "error", err)...)
	return true
}

// subscriptions are a link's subscriptions, ended together.
type subscriptions []*nats.Subscription

// handler is a subscription to make: cb on subject, in queue group queue
// unless queue is empty (then every subscriber receives every message).
type handler struct {
	subject, queue string
	cb             nats.MsgHandler
}

// add makes the subscriptions hs on nc, in order, and stops at the first
// that fails.
func (s *subscriptions) add(nc *nats.Conn, hs ...handler) error {
	for _, h := range hs {
		sub, err := nc.QueueSubscribe(h.subject, h.queue, h.cb)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", h.subject, err)
		}
		*s = append(*s, sub)
	}
	return nil
}

// close ends every subscription in s.
func (s subscriptions) close() error {
	var errs []error
	for _, sub := range s {
		errs = append(errs, sub.Unsubscribe())
	}
	return errors.Join(errs...)
}
