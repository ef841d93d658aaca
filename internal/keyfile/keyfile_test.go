package keyfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/urnbd/urnbd/rtrs"
)

func TestRoundTripAndErrors(t *testing.T) {
	a, _ := rtrs.GenerateKey("alice")
	b, _ := rtrs.GenerateKey("bob@db-1")
	text := "# keys\n\n" + Line(a) + "  " + Line(b)
	keys, err := Parse([]byte(text), "f")
	if err != nil || len(keys) != 2 || keys[0].Name != "alice" || string(keys[1].Secret) != string(b.Secret) {
		t.Fatalf("Parse: %v %v", keys, err)
	}
	for text, want := range map[string]string{
		"alice\n":                      "f:1: want NAME SECRET",
		"alice !!!\n":                  "not base64",
		"alice c2hvcnQ=\n":             "at least 16",
		"#\nbad/name " + Line(a)[6:]:   "f:2:",
		"alice " + Line(a)[6:] + "x\n": "f:2: want NAME SECRET",
	} {
		if _, err := Parse([]byte(text), "f"); err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Parse(%q) = %v, want EINVAL with %q", text, err, want)
		}
	}
}

func TestReadChecksMode(t *testing.T) {
	a, _ := rtrs.GenerateKey("alice")
	path := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(path, []byte(Line(a)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); !errors.Is(err, syscall.EPERM) || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("world-readable key file: %v, want EPERM saying chmod 600", err)
	}
	os.Chmod(path, 0o600)
	k, err := ReadOne(path)
	if err != nil || k.Name != "alice" {
		t.Fatalf("ReadOne: %v %v", k, err)
	}
	os.WriteFile(path, []byte(Line(a)+strings.Replace(Line(a), "alice", "al2", 1)), 0o600)
	if _, err := ReadOne(path); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("client key file with two keys: %v", err)
	}
	if _, err := Read(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}
