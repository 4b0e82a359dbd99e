package region

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/redis/go-redis/v9"
	"github.com/tinylib/msgp/msgp"

	"github.com/sluicehq/sluice/window"
)

// RedisCell is a cell's value as the Redis origin stores it, field for
// field (docs/architecture.md, "Redis"), before any tidying: what tools
// and tests that look at Redis directly read, and what a first touch
// reads of the previous cell (touchResult). Every other path reads a cell
// inside the scripts.
type RedisCell struct {
	// Charged is "t": everything charged, leases included.
	Charged int64
	// Used is "u": admissions reported, with the unused part of an ended
	// lease counted as used once the cell was tidied.
	Used int64
	// Own and Foreign are "o" and "g", what the bridge's imports stored.
	Own, Foreign int64
	// ContendedUntil is "x", a unix ms by Redis's clock.
	ContendedUntil int64
	// TidyAt is "n": when the reporters are next to be tidied (0: none).
	TidyAt int64
	// Lost is "b": admissions the cell lost and got back from the bridge or
	// a floor.
	Lost int64
	// Reversals is "r": leases counted as used that came back.
	Reversals int64
	// Reporters holds each reporter's state by its ID (with
	// "/<generation>" from its second generation on).
	Reporters map[string]RedisReporter
	// Locals holds the largest local count the cell was told, by LocalID.
	Locals map[string]int64
}

// RedisReporter is one reporter's state in a RedisCell.
type RedisReporter struct {
	// Seq is its last sync's Seq; negative: retired at that unix ms.
	Seq int64
	// Used is what it used, Claimed what it claimed (Claimed > Used: a
	// lease).
	Used, Claimed int64
	// Until is until when its lease is live, or when it was last heard of
	// if it holds none (unix ms by Redis's clock).
	Until int64
}

// Cell returns the value Redis holds for cell c as it is, untidied, and
// whether the key exists.
func (r *Redis) Cell(ctx context.Context, c window.Cell) (RedisCell, bool, error) {
	raw, err := r.client.Get(ctx, r.Key(c)).Result()
	return r.cellReply("redis cell", c, raw, err)
}

// cellReply reads the reply (raw, err) of a GET of cell c's key: the
// value, and whether the key exists. Errors start with what.
func (r *Redis) cellReply(what string, c window.Cell, raw string, err error) (RedisCell, bool, error) {
	switch {
	case errors.Is(err, redis.Nil):
		return RedisCell{}, false, nil
	case err != nil:
		return RedisCell{}, false, fmt.Errorf("%s: %w", what, err)
	}
	v, err := ParseRedisCell([]byte(raw))
	if err != nil {
		return RedisCell{}, false, fmt.Errorf("%s %s: %w", what, r.Key(c), err)
	}
	return v, true, nil
}

// ParseRedisCell reads a cell's value as the scripts write it: the
// MessagePack array {t, u, o, g, x, n, b, r, reporters, locals} (cellLua).
// Anything else is an error; nothing in it is trusted further than its
// shape.
func ParseRedisCell(raw []byte) (RedisCell, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(raw)
	if err != nil || n != 10 {
		return RedisCell{}, fmt.Errorf("cell value: want an array of 10, got %d (%v)", n, err)
	}
	var c RedisCell
	for _, f := range []*int64{&c.Charged, &c.Used, &c.Own, &c.Foreign, &c.ContendedUntil, &c.TidyAt, &c.Lost, &c.Reversals} {
		if *f, b, err = readNumber(b); err != nil {
			return RedisCell{}, fmt.Errorf("cell value: %w", err)
		}
	}
	c.Reporters = map[string]RedisReporter{}
	b, err = readMap(b, func(id string, b []byte) ([]byte, error) {
		n, b, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil || n != 4 {
			return nil, fmt.Errorf("reporter %q: want an array of 4, got %d (%v)", id, n, err)
		}
		var rep RedisReporter
		for _, f := range []*int64{&rep.Seq, &rep.Used, &rep.Claimed, &rep.Until} {
			if *f, b, err = readNumber(b); err != nil {
				return nil, fmt.Errorf("reporter %q: %w", id, err)
			}
		}
		c.Reporters[id] = rep
		return b, nil
	})
	if err != nil {
		return RedisCell{}, fmt.Errorf("cell value: %w", err)
	}
	c.Locals = map[string]int64{}
	b, err = readMap(b, func(id string, b []byte) ([]byte, error) {
		v, b, err := readNumber(b)
		if err != nil {
			return nil, fmt.Errorf("local %q: %w", id, err)
		}
		c.Locals[id] = v
		return b, nil
	})
	if err != nil {
		return RedisCell{}, fmt.Errorf("cell value: %w", err)
	}
	if len(b) != 0 {
		return RedisCell{}, fmt.Errorf("cell value: %d bytes after the array", len(b))
	}
	return c, nil
}

// readMap reads a map of string keys, each value by one; Lua writes an
// empty table as an empty array.
func readMap(b []byte, one func(key string, b []byte) ([]byte, error)) ([]byte, error) {
	if msgp.NextType(b) == msgp.ArrayType {
		n, rest, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil || n != 0 {
			return nil, fmt.Errorf("want a map, got an array of %d (%v)", n, err)
		}
		return rest, nil
	}
	n, b, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return nil, fmt.Errorf("want a map: %w", err)
	}
	for range n {
		var key string
		if key, b, err = msgp.ReadStringBytes(b); err != nil {
			return nil, fmt.Errorf("map key: %w", err)
		}
		if b, err = one(key, b); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// readNumber reads a Lua number as cmsgpack writes it: an integer, or a
// double when it is not one (clamped to ±window.MaxCount).
func readNumber(b []byte) (int64, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.IntType:
		v, rest, err := msgp.ReadInt64Bytes(b)
		return max(min(v, window.MaxCount), -window.MaxCount), rest, err
	case msgp.UintType:
		v, rest, err := msgp.ReadUint64Bytes(b)
		return int64(min(v, window.MaxCount)), rest, err
	case msgp.Float64Type, msgp.Float32Type:
		v, rest, err := msgp.ReadFloat64Bytes(b)
		if err != nil || math.IsNaN(v) {
			return 0, nil, fmt.Errorf("want a number, got %v (%v)", v, err)
		}
		return replyInt(v), rest, nil
	}
	return 0, nil, fmt.Errorf("want a number, got %s", msgp.NextType(b))
}
