package nats

import (
	"net/url"
	"path/filepath"
	"testing"
	"time"

	server "github.com/nats-io/nats-server/v2/server"
)

// The shipped region configurations parse, name their region consistently,
// and, with their ports rewritten to free ones, form a full supercluster.
func TestShippedRegionConfigsFormASupercluster(t *testing.T) {
	server.SetGatewaysSolicitDelay(10 * time.Millisecond)
	regions := []string{"us", "eu", "ap"}
	var started []*server.Server
	t.Cleanup(func() {
		for _, s := range started {
			s.Shutdown()
			s.WaitForShutdown()
		}
	})
	for _, r := range regions {
		opts, err := server.ProcessConfigFile(filepath.Join("configs", r+".conf"))
		if err != nil {
			t.Fatalf("%s.conf: %v", r, err)
		}
		if opts.Cluster.Name != r || opts.Gateway.Name != r || len(opts.Gateway.Gateways) != len(regions) {
			t.Fatalf("%s.conf: cluster %q, gateway %q with %d remotes", r, opts.Cluster.Name, opts.Gateway.Name, len(opts.Gateway.Gateways))
		}
		// Rewrite ports: the shipped ones may be taken here.
		opts.Port, opts.HTTPPort, opts.Cluster.Port, opts.Gateway.Port = -1, 0, -1, -1
		opts.NoLog, opts.NoSigs = true, true
		var remotes []*server.RemoteGatewayOpts
		for _, s := range started {
			remotes = append(remotes, &server.RemoteGatewayOpts{Name: s.ClusterName(),
				URLs: []*url.URL{{Scheme: "nats", Host: s.GatewayAddr().String()}}})
		}
		opts.Gateway.Gateways = remotes
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("%s.conf: %v", r, err)
		}
		go s.Start()
		if !s.ReadyForConnections(5 * time.Second) {
			t.Fatalf("%s never became ready", r)
		}
		started = append(started, s)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range started {
		for s.NumOutboundGateways() < len(regions)-1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s has %d outbound gateways, want %d", s.ClusterName(), s.NumOutboundGateways(), len(regions)-1)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
