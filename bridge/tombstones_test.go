package bridge

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// A tombstone ends once policy.TombstoneCutoff passes its version: the
// bridge's cleanup prunes it from its table and from the store, no read of
// the store brings it back (full or by change), a limiter still holding it
// cannot bring it back either, and the bridge's digest is then that of a
// table that never held it, so limiters pruning at the same cutoff agree
// with it without a snapshot.
func TestTombstonesEndEverywhereAndStayGone(t *testing.T) {
	now := int64(1_700_000_000_000)
	clock := func() time.Time { return time.UnixMilli(now) }
	store := NewMemoryStore()
	b, err := NewBridge(BridgeConfig{Region: "us", Store: store, Transport: &markTransport{}, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	k := policy.Key{Workspace: "ws", Namespace: "api", Pattern: "user_*"}
	set := policy.Entry{Key: k, Override: policy.Override{Limit: 5, Duration: 60_000}, Version: policy.Version{At: now, Origin: "us"}}
	del := policy.Entry{Key: k, Deleted: true, Version: policy.Version{At: now + 1, Origin: "us"}}
	kept := policy.Entry{Key: policy.Key{Workspace: "ws", Namespace: "api", Pattern: "kept"},
		Override: policy.Override{Limit: 7, Duration: 60_000}, Version: policy.Version{At: now, Origin: "us"}}
	if err := b.FromLimiterPolicies([]policy.Entry{set, del, kept}, nil, now); err != nil {
		t.Fatal(err)
	}
	if err := b.writePolicies(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(b.Policies().Entries()); n != 2 {
		t.Fatalf("%d entries before the retention passed, want the tombstone and the live one", n)
	}

	// One step of the cutoff before it passes: still there.
	now = del.Version.At + policy.TombstoneRetention.Milliseconds()
	b.cleanup()
	if n := len(b.Policies().Entries()); n != 2 {
		t.Fatalf("%d entries as the retention ends, want the tombstone kept until the cutoff passes it", n)
	}
	now += time.Minute.Milliseconds()
	b.cleanup()
	want := policy.NewTable()
	if _, err := want.Merge(kept); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		if got := b.Policies().Entries(); len(got) != 1 || got[0] != kept {
			t.Fatalf("%s: the bridge holds %+v, want only the live override", when, got)
		}
		if b.PolicyDigests().Total != want.Digest() {
			t.Fatalf("%s: the bridge's digest differs from that of a table that never held the tombstone", when)
		}
	}
	check("after the cleanup")
	if es, _ := store.LoadOverrides(t.Context()); len(es) != 1 || es[0] != kept {
		t.Fatalf("the store holds %+v after the cleanup, want only the live override", es)
	}
	b.mark = 0 // a full read, as at start
	if err := b.reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	check("after a full read of the store")
	// A limiter that still holds it sends everything it holds.
	if err := b.FromLimiterPolicies([]policy.Entry{del, kept}, nil, now); err != nil {
		t.Fatalf("a pruned tombstone from a limiter: %v, want it ignored, not refused", err)
	}
	check("after a limiter sent it again")
	if n := b.Refused(); len(n) != 0 {
		t.Fatalf("refused %v, want nothing", n)
	}
}
