// Package nats runs NATS for Sluice: an in-process nats-server for single
// node deployments, and ready-made topologies (a single server, a
// supercluster of regions joined by gateways) for tests in any package.
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
package nats
