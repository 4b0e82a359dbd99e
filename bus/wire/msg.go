package wire

// The msgpack shapes of everything off the check endpoint's request path,
// from which msgp generates the codecs in msg_gen.go: run
// `go generate ./bus/wire` after changing them (TestGeneratedCodeIsFresh
// fails until then). What the limiter must refuse with a 400 (check and
// batch requests) is decoded by hand in codec_msgpack.go, because the
// contract names every error and a generated decoder skips unknown keys and
// cannot see a missing one.
//
// Shapes ending in Out are only written and shapes ending in In only read,
// so msgp generates only that half of each codec (the directives below).
// Shapes ending in Out each convert from the public type at no
// cost (same fields, same order), and the client's JSON requests are written
// from them by encoding/json. Shapes ending in In are read by the client:
// their fields record whether the key was present (the shims below), so that
// a missing key is an error; unknown keys are skipped and a repeated key is
// an error (noduplicates).

//go:generate go tool msgp -unexported -io=false -tests=false -file $GOFILE -o ${MSGP_OUT}msg_gen.go

//msgp:noduplicates
//msgp:shim gotBool as:bool using:(gotBool).value/markBool
//msgp:shim gotInt as:int64 using:(gotInt).value/markInt
//msgp:shim gotString as:string using:(gotString).value/markString
//msgp:ignore gotBool gotInt gotString
//msgp:marshal ignore checkResponseIn batchResponseHeadIn checksResponseHeadIn errorIn
//msgp:size ignore checkResponseIn batchResponseHeadIn checksResponseHeadIn errorIn
//msgp:unmarshal ignore checkResponseOut checkRequestOut batchCheckOut

// checkResponseOut is a CheckResponse as the limiter writes it, keys in the
// contract's order.
type checkResponseOut struct {
	Success      bool   `msg:"success" json:"success"`
	Limit        int64  `msg:"limit" json:"limit"`
	Remaining    int64  `msg:"remaining" json:"remaining"`
	Reset        int64  `msg:"reset" json:"reset"`
	RetryAfter   int64  `msg:"retry_after" json:"retry_after"`
	ShadowDenied bool   `msg:"shadow_denied,omitempty" json:"shadow_denied,omitempty"`
	Override     string `msg:"override,omitempty" json:"override,omitempty"`
}

// checkRequestOut is a CheckRequest as the client writes it (outOfCheck):
// all four keys, and the optional ones only when they are not the default.
type checkRequestOut struct {
	Identifier string `msg:"identifier" json:"identifier"`
	Limit      int64  `msg:"limit" json:"limit"`
	Duration   int64  `msg:"duration,omitempty" json:"duration,omitempty"` // none with a calendar window
	Cost       int64  `msg:"cost" json:"cost"`
	Shadow     bool   `msg:"shadow,omitempty" json:"shadow,omitempty"`
	Window     string `msg:"window,omitempty" json:"window,omitempty"`
	Charge     string `msg:"charge,omitempty" json:"charge,omitempty"`
}

// batchCheckOut is one check of a batch as the client writes it
// (outOfBatchCheck): all five keys, and the optional ones only when they
// are not the default.
type batchCheckOut struct {
	Namespace  string `msg:"namespace" json:"namespace"`
	Identifier string `msg:"identifier" json:"identifier"`
	Limit      int64  `msg:"limit" json:"limit"`
	Duration   int64  `msg:"duration,omitempty" json:"duration,omitempty"` // none with a calendar window
	Cost       int64  `msg:"cost" json:"cost"`
	Shadow     bool   `msg:"shadow,omitempty" json:"shadow,omitempty"`
	Window     string `msg:"window,omitempty" json:"window,omitempty"`
	Charge     string `msg:"charge,omitempty" json:"charge,omitempty"`
}

// checkResponseIn is a check response as the client reads it.
type checkResponseIn struct {
	Success    gotBool `msg:"success"`
	Limit      gotInt  `msg:"limit"`
	Remaining  gotInt  `msg:"remaining"`
	Reset      gotInt  `msg:"reset"`
	RetryAfter gotInt  `msg:"retry_after"`
	// ShadowDenied is optional: absent means false.
	ShadowDenied gotBool `msg:"shadow_denied"`
	// Override is optional: absent means none applied. A str or a bin.
	Override strOrBin `msg:"override"`
}

// batchResponseHeadIn is a batch response as the client first reads it: the
// results are read one by one afterwards, so that an error names its index.
type batchResponseHeadIn struct {
	Success gotBool  `msg:"success"`
	Results rawValue `msg:"results"`
}

// checksResponseHeadIn is a checks response as the client first reads it,
// as batchResponseHeadIn.
type checksResponseHeadIn struct {
	Results rawValue `msg:"results"`
}

// errorIn is an error body as the client reads it.
type errorIn struct {
	Error gotString `msg:"error"`
}
