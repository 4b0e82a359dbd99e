package event

// The msgpack shapes of the internal events, from which msgp generates the
// codecs in msg_gen.go: run `go generate ./bus/event` after changing them
// (TestGeneratedCodeIsFresh fails until then). Integers are uint64 so that
// the generated encoders write the shortest unsigned form, as the events
// always have; int64 fields would write signed forms and change the bytes.
// Entries are tuples (fixed-order arrays, their length checked); the cell's
// fields are flattened into each entry. noduplicates makes a repeated key an
// error. There is no msgp:limit: the entry lists bound themselves (types.go),
// and reading a map's keys allocates nothing, so a map may hold any number of
// keys unknown to this version.

//go:generate go tool msgp -unexported -io=false -tests=false -file $GOFILE -o ${MSGP_OUT}msg_gen.go

//msgp:tuple wireComponent wireDenial wireImport
//msgp:ignore wireCell
//msgp:noduplicates

// componentsEvent is {"v": 1, "c": [component, ...]}.
type componentsEvent struct {
	V version       `msg:"v"`
	C componentList `msg:"c"`
}

// denialsEvent is {"v": 1, "d": [denial, ...]}.
type denialsEvent struct {
	V version    `msg:"v"`
	D denialList `msg:"d"`
}

// importsEvent is {"v": 1, "i": [import, ...]}.
type importsEvent struct {
	V version    `msg:"v"`
	I importList `msg:"i"`
}

// chunkEvent is {"v": 1, "i": [import, ...], "m": more}.
type chunkEvent struct {
	V version    `msg:"v"`
	I importList `msg:"i"`
	M more       `msg:"m"`
}

// wireCell is the five fields of a cell that begin every entry.
type wireCell struct {
	Workspace  token
	Namespace  token
	Identifier identifier
	Duration   uint64
	Sequence   uint64
}

// wireComponent is [workspace, namespace, identifier, duration, sequence, region, count, expire_at].
type wireComponent struct {
	wireCell `msg:",flatten"`
	Region   token
	Count    uint64
	ExpireAt uint64
}

// wireDenial is [workspace, namespace, identifier, duration, sequence, region, usage, expire_at].
type wireDenial struct {
	wireCell `msg:",flatten"`
	Region   token
	Usage    uint64
	ExpireAt uint64
}

// wireImport is [workspace, namespace, identifier, duration, sequence, foreign, own, floor, expire_at].
type wireImport struct {
	wireCell `msg:",flatten"`
	Foreign  uint64
	Own      uint64
	Floor    uint64
	ExpireAt uint64
}
