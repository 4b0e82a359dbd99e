package event

import (
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/global"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/window"
)

// A calendar period travels as a duration does: components and
// imports of its cells, and overrides and reset marks naming it, come back
// as sent; a code naming no unit is refused with the rule it breaks.
func TestCalendarPeriodsTravel(t *testing.T) {
	month, _, err := window.ParseCalendar("month@Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	cell := window.Cell{Workspace: "acme", Namespace: "api", Identifier: "tenant-7", Duration: month,
		Sequence: window.Sequence(1_796_079_600_000, month)}
	cs := []global.Component{{Cell: cell, Region: "eu", Count: 9_999, ExpireAt: cell.Expiry(60_000)}}
	if got, err := DecodeComponents(AppendComponents(nil, cs)); err != nil || !reflect.DeepEqual(got, cs) {
		t.Fatalf("components: %+v, %v", got, err)
	}
	is := []global.Import{{Cell: cell, Foreign: 5, Own: 3, ExpireAt: cell.Expiry(60_000)}}
	if got, err := DecodeImports(AppendImports(nil, is)); err != nil || !reflect.DeepEqual(got, is) {
		t.Fatalf("imports: %+v, %v", got, err)
	}
	p := Policies{Overrides: []policy.Entry{{Key: policy.Key{Workspace: "acme", Namespace: "api", Pattern: "tenant_*"},
		Override: policy.Override{Limit: 10_000, Duration: month}, Version: policy.Version{At: 1, Origin: "eu"}}},
		Marks: []policy.Mark{{Workspace: "acme", Namespace: "api", Identifier: "tenant-7", Duration: month, Epoch: 1_796_079_600_001}}}
	if got, err := DecodePolicies(AppendPolicies(nil, p)); err != nil || !reflect.DeepEqual(got, p) {
		t.Fatalf("policies: %+v, %v", got, err)
	}

	bad := cell
	bad.Duration = month | 7 // unit 7: none
	if _, err := DecodeComponents(AppendComponents(nil, []global.Component{{Cell: bad, Region: "eu", Count: 1}})); err == nil ||
		!strings.Contains(err.Error(), "neither 1000 to 31622400000 milliseconds nor a calendar period") {
		t.Fatalf("a component of code %d: %v", bad.Duration, err)
	}
	p.Marks[0].Duration = month | 7
	if _, err := DecodePolicies(AppendPolicies(nil, p)); err == nil || !strings.Contains(err.Error(), "nor a calendar period") {
		t.Fatalf("a mark of code %d: %v", p.Marks[0].Duration, err)
	}
}
