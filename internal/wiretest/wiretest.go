// Package wiretest has the small assertions shared by the tests of the wire
// codecs (rtrs, rnbd, rtrs/tcp).
package wiretest

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// Hex decodes space-separated hex bytes, e.g. "03 00 20 00".
func Hex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// WantErr fails unless err wraps target.
func WantErr(t testing.TB, err, target error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want %v", target)
	}
	if !errors.Is(err, target) {
		t.Fatalf("got error %q, want one wrapping %q", err, target)
	}
}

// NoErr fails if err is not nil.
func NoErr(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
