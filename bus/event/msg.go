package event

// The msgpack shapes of the internal events, from which msgp generates the
// codecs in msg_gen.go: run `go generate ./bus/event` after changing them
// (TestGeneratedCodeIsFresh fails until then). The generated code decodes
// the events and their entries and encodes the event maps; the entries are
// encoded by hand (the entry codecs, types.go and policy.go), which is
// faster (BenchmarkAppendComponents), and TestEntriesAsGenerated checks that
// they write what the generated tuple encoders write. Integers are uint64
// so that the generated code writes and reads the unsigned forms, as the
// events always have; int64 fields would write signed forms and change the
// bytes. Entries are tuples (fixed-order arrays, their length checked); the
// cell's fields are flattened into each entry. A policies event's optional
// keys are omitzero or omitempty, written only when set. noduplicates makes
// a repeated key an error. There is no msgp:limit: the entry lists bound
// themselves (list.go), and reading a map's keys allocates nothing, so a
// map may hold any number of keys unknown to this version.

//go:generate go tool msgp -unexported -io=false -tests=false -file $GOFILE -o ${MSGP_OUT}msg_gen.go

//msgp:tuple wireComponent wireImport wireOverride wireMark
//msgp:ignore wireCell
//msgp:noduplicates

// componentsEvent is {"v": 1, "c": [component, ...]}.
type componentsEvent struct {
	V version       `msg:"v"`
	C componentList `msg:"c"`
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

// wireImport is [workspace, namespace, identifier, duration, sequence, foreign, own, expire_at].
type wireImport struct {
	wireCell `msg:",flatten"`
	Foreign  uint64
	Own      uint64
	ExpireAt uint64
}

// policiesEvent is {"v": 1, "o": [override, ...], "r": [mark, ...], "m": more, "g": digest, "s": seq, "d": [part, ...]}.
type policiesEvent struct {
	V version      `msg:"v"`
	O overrideList `msg:"o"`
	R markList     `msg:"r,omitzero"`
	M more         `msg:"m,omitzero"`
	G uint64       `msg:"g,omitempty"`
	S uint64       `msg:"s,omitempty"`
	D digestParts  `msg:"d,omitzero"`
}

// wireOverride is [workspace, namespace, pattern, limit, duration, flags, at, origin].
type wireOverride struct {
	Workspace token
	Namespace token
	Pattern   identifier
	Limit     uint64
	Duration  uint64
	Flags     uint64
	At        uint64
	Origin    token
}

// wireMark is [workspace, namespace, identifier, duration, epoch].
type wireMark struct {
	Workspace  token
	Namespace  token
	Identifier identifier
	Duration   uint64
	Epoch      uint64
}
