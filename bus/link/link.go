// Package link carries the global layer over NATS between a region's
// limiters and its bridge, and between the regions' bridges: a limiter's
// components, denials and local counts and its imports (Global,
// RequestSnapshot), its overrides and reset marks (Policy), and the bridge's
// side of both (Bridge, which implements bridge.Transport). Every message is
// stamped with its sender's clock (SentAtHeader) and carries at most 1,000
// entries. The limiter's doors, the endpoints clients call, are in
// bus/transport; neither package imports the other.
package link

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
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

// unixMs returns now's reading of clock, time.Now when clock is nil.
func unixMs(clock func() time.Time) int64 {
	if clock == nil {
		return time.Now().UnixMilli()
	}
	return clock().UnixMilli()
}

// ack acknowledges a limiter's publication, when it asked for that: the
// limiter sends it again otherwise. A malformed one is acknowledged too,
// as sending it again cannot help.
func ack(m *nats.Msg) {
	if m.Reply != "" {
		_ = m.Respond(nil)
	}
}
