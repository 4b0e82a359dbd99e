package test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"testing"
)

// apache2SHA256 is the SHA-256 of the Apache License 2.0 as the Apache
// Software Foundation publishes it (https://www.apache.org/licenses/LICENSE-2.0.txt,
// the LICENSE of nats.go and nats-server), placeholder copyright line included.
const apache2SHA256 = "c71d239df91726fc519c6eb72d318ec65820627232b2f796219e87dcf35d0ab4"

// LICENSE is the Apache License 2.0, word for word, with the appendix's
// copyright line naming The Sluice Authors: nothing else may differ.
func TestLicenseIsTheApache2TextWithOurCopyright(t *testing.T) {
	text, err := os.ReadFile("../LICENSE")
	if err != nil {
		t.Fatal(err)
	}
	const ours = "   Copyright 2026 The Sluice Authors\n"
	if n := bytes.Count(text, []byte(ours)); n != 1 {
		t.Fatalf("LICENSE holds %q %d times, want once", ours, n)
	}
	standard := bytes.Replace(text, []byte(ours), []byte("   Copyright [yyyy] [name of copyright owner]\n"), 1)
	if sum := sha256.Sum256(standard); hex.EncodeToString(sum[:]) != apache2SHA256 {
		t.Errorf("LICENSE, copyright line aside, is not the standard Apache License 2.0 text (sha256 %x)", sum)
	}
}
