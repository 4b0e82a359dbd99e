// Package natstest starts NATS topologies for tests in any package: a
// single server, a supercluster of regions joined by gateways, and the
// shipped region configs (nats/configs). Servers are embedded
// (nats/embedded) and listen on loopback.
//
// Every function that waits takes a [context.Context] and returns only once
// the servers it started are usable: accepting clients and, for a
// supercluster, fully meshed with cross-region interest propagating. On
// error, every server started so far has been shut down.
//
// A supercluster started with [SuperclusterOptions.CuttableGateways] can be
// partitioned ([Supercluster.CutGateways]) and healed
// ([Supercluster.HealGateways]) while each region keeps serving its own
// clients, to test behaviour across a network partition between regions.
//
// Inside this package, nats-server is imported as server and the client
// library (nats.go) as natsgo.
package natstest
