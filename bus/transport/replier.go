package transport

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/sluicehq/sluice/bus/wire"
)

// replier publishes the check endpoint's inline replies from a goroutine of
// its own, in batches. The endpoint's callback handles one message at a
// time; with the replier it only encodes a reply into the pending batch,
// and the publishes (the connection's lock, which its flusher holds while
// it writes to the socket, and its buffer) happen beside it (docs/
// architecture.md says what that is worth).
//
// Once closed, add publishes at once from the caller: close publishes what
// is pending, so no reply added before or after it is lost, as long as the
// connection still takes publishes. The caller also publishes at once while
// maxPendingReplies wait, so a replier that falls behind holds back the
// endpoint instead of growing without bound.
type replier struct {
	// pub publishes one reply; the connection's Publish.
	pub func(subject string, body []byte) error
	log *slog.Logger

	mu     sync.Mutex
	buf    []byte  // encoded bodies of the pending replies
	batch  []reply // pending replies, their bodies in buf
	closed bool

	wake chan struct{} // one token: the batch went from empty to not empty
	stop chan struct{}
	done chan struct{}
}

// maxPendingReplies bounds the pending batch (about 100 bytes a reply).
const maxPendingReplies = 4096

// reply is one pending reply: its subject and its body's bounds in the
// batch buffer.
type reply struct {
	subject    string
	start, end int
}

// startReplier returns a replier publishing with pub.
func startReplier(pub func(subject string, body []byte) error, log *slog.Logger) *replier {
	r := &replier{pub: pub, log: log, buf: make([]byte, 0, 16<<10),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// add queues the reply resp, in encoding enc, to subject.
func (r *replier) add(subject string, enc wire.Encoding, resp wire.CheckResponse) {
	r.mu.Lock()
	if r.closed || len(r.batch) >= maxPendingReplies {
		r.mu.Unlock()
		r.publish(subject, wire.AppendCheckResponse(make([]byte, 0, 96), enc, resp))
		return
	}
	first := len(r.batch) == 0
	start := len(r.buf)
	r.buf = wire.AppendCheckResponse(r.buf, enc, resp)
	r.batch = append(r.batch, reply{subject, start, len(r.buf)})
	r.mu.Unlock()
	if first {
		select {
		case r.wake <- struct{}{}:
		default: // a token is already waiting
		}
	}
}

// run publishes batches until the replier closes, then publishes the last.
func (r *replier) run() {
	defer close(r.done)
	var (
		buf   = make([]byte, 0, 16<<10)
		batch []reply
	)
	for {
		select {
		case <-r.wake:
			buf, batch = r.flush(buf, batch)
		case <-r.stop:
			r.flush(buf, batch)
			return
		}
	}
}

// flush takes the pending batch, leaving buf and batch (emptied) in its
// place, publishes it and returns its storage for the next swap.
func (r *replier) flush(buf []byte, batch []reply) ([]byte, []reply) {
	r.mu.Lock()
	buf, r.buf = r.buf, buf[:0]
	batch, r.batch = r.batch, batch[:0]
	r.mu.Unlock()
	for _, p := range batch {
		r.publish(p.subject, buf[p.start:p.end])
	}
	return buf, batch
}

func (r *replier) publish(subject string, body []byte) {
	if err := r.pub(subject, body); err != nil {
		r.log.Debug("reply failed", "subject", subject, "error", err)
	}
}

// close publishes what is pending and makes later adds publish at once. It
// returns when the last batch has been handed to the connection, or with an
// error when ctx ends first (the replier's goroutine still publishes the
// batch it holds and then stops).
func (r *replier) close(ctx context.Context) error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.stop)
	}
	r.mu.Unlock()
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("replies still being published: %w", ctx.Err())
	}
}
