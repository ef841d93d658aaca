package rtrs

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// hx decodes space-separated hex bytes, e.g. "03 00 20 00".
func hx(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// wantErr fails unless err wraps target.
func wantErr(t testing.TB, err, target error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want %v", target)
	}
	if !errors.Is(err, target) {
		t.Fatalf("got error %q, want one wrapping %q", err, target)
	}
}

func mustNoErr(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
