package natstest

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// The shipped region configurations parse, name their region consistently,
// and, with their ports rewritten to free ones, form a full supercluster.
func TestShippedRegionConfigsFormASupercluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	regions := []string{"us", "eu", "ap"}
	var files []string
	for _, r := range regions {
		files = append(files, filepath.Join("../../nats/configs", r+".conf"))
	}
	servers, opts, err := StartConfigs(ctx, files...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range servers {
			s.Shutdown()
			s.WaitForShutdown()
		}
	})
	for i, r := range regions {
		if opts[i].Cluster.Name != r || opts[i].Gateway.Name != r {
			t.Fatalf("%s.conf: cluster %q, gateway %q", r, opts[i].Cluster.Name, opts[i].Gateway.Name)
		}
		if servers[i].NumOutboundGateways() != len(regions)-1 {
			t.Fatalf("%s: %d outbound gateways", r, servers[i].NumOutboundGateways())
		}
	}
}
