// Package mysql is the durable global store on MySQL or MariaDB: a
// bridge.Store of every region's components and denials, its schema and
// migrations, and a store that connects in the background (OpenLazy) so
// that a bridge starts while the database is down or not created yet. Only
// the bridge links it.
package mysql
